import sys

from simserve.cli import main

sys.exit(main())
