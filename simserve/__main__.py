from simserve.cli import console

console()
