"""Stage vLLM for the lent GPU machine (issue #16), which reaches no package registry.

The device image (the device tool's KINDS.md) has Python 3.12 and torch 2.11.0+cu130 but no
vLLM. Its wheel must travel with a ``run`` call, and a call carries at most 64 MiB (the working
tree included); ignored files left on a warm machine stay between calls (30 s idle). So this
script, on the CPU side, with the ordinary pip client:

1. ``download``: fetches the vLLM wheel (:data:`VLLM`) and exactly the wheels staged in
   ``gpu_stage_deps.json`` (what the dense-model serving path imports and the image lacks)
   and :data:`SIMSERVE_DEPS`, for CPython 3.12 on manylinux x86-64, into ``STAGE/wheels``.
2. ``check``: reads the vLLM wheel's METADATA (``Requires-Dist: torch==2.11.0``: the image's
   torch) and its extensions' ELF ``NEEDED`` entries (``libcudart.so.13``: CUDA 13, the
   image's ``cu130``); sorts every ``Requires-Dist`` into *in the image* (KINDS.md's package
   list, :data:`IMAGE_PACKAGES`), *staged* or *left out* (``gpu_stage_deps.json``, each
   left-out one with the reason), and fails if one falls in none of them.
3. ``pack``: rewrites the vLLM wheel without :data:`PRUNE` (files a dense bf16 model on Hopper
   never loads, each with the reason; the wheel's RECORD is rewritten to match), puts every
   wheel into one uncompressed tar (wheels are already compressed), splits it into pieces of
   at most ``--piece-mib`` (default: 60 MiB, less if the working tree is large) and writes
   ``STAGE/manifest.json`` (the tar's and each piece's SHA-256, the pruned files, versions).
4. ``plan``: prints the exact sequence of device ``run`` calls (carry lists and commands).
5. ``imports --python PY --site DIR``: imports the serving path's modules
   (:data:`IMPORT_CHECK_MODULES`) from the staged wheels installed in DIR, with an interpreter
   that holds only the image's packages, and names every missing module. Rehearsed here with a
   Python 3.11 venv holding the local torch CPU wheel and the image's packages that vLLM names
   (pydantic, which pip pulled in beside them, uninstalled again), and DIR made by ``pip install
   --no-deps --target DIR`` of the staged names and versions for cp311 plus the pruned vLLM wheel
   (abi3). Its first run found llguidance and xgrammar missing; now none is. Without CUDA,
   modules that load CUDA extensions stop there, so what they import after that is unchecked.

On the device, the same script's ``receive PIECE`` moves one carried piece out of the working
tree into ``/tmp/vllm-stage`` (checking its SHA-256), and ``install`` joins the pieces, checks
the whole tar's SHA-256, ``pip install --no-index --no-deps --target /tmp/site`` the wheels and
imports vLLM with ``PYTHONPATH=/tmp/site``. Nothing here needs a GPU; ``install`` and the
joining are rehearsed on the CPU side (``tests/unit/test_gpu_stage.py``;
``python benchmarks/gpu_stage_vllm.py rehearse``).

Why vLLM 0.24.0: it is the newest release whose wheel pins the image's torch
(``torch==2.11.0``, ``torchvision==0.26.0``, ``torchaudio==2.11.0``, all three in the image)
and whose CUDA extensions link ``libcudart.so.13``; ``check`` verifies both on the wheel
itself. vLLM's C++ extensions are built against one torch ABI, so a wheel pinning another torch
would need a torch too (about 900 MB more, 15 more calls).

    python benchmarks/gpu_stage_vllm.py download check pack plan
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGE = ROOT / ".gpu-stage"                   # ignored by .gitignore; never committed
DEVICE_STAGE = Path("/tmp/vllm-stage")        # on the device, outside the working tree
DEVICE_SITE = Path("/tmp/site")               # where the wheels are installed there
MIB = 1 << 20
CARRY_LIMIT = 64 * MIB                        # the device tool: working tree + carried paths
TAR_NAME = "vllm-stage.tar"

VLLM = ("vllm", "0.24.0")
# torch and what the vLLM wheel was built against, as the image has them (KINDS.md)
IMAGE_TORCH = {"torch": "2.11.0", "torchvision": "0.26.0", "torchaudio": "2.11.0"}
IMAGE_CUDA_RUNTIME = "libcudart.so.13"

PLATFORM_ARGS = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                 *[a for tag in ("manylinux_2_39_x86_64", "manylinux_2_35_x86_64",
                                 "manylinux_2_34_x86_64", "manylinux_2_31_x86_64",
                                 "manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
                                 "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
                                 "manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64",
                                 "any")
                   for a in ("--platform", tag)]]

# KINDS.md, "Python packages already there" (read 2026-11-17), normalised names.
IMAGE_PACKAGES = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn
einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio
iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml
markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda
numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13
nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum
opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip
pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo
pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov
pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests
rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn
sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric
torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions
typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())

# What is staged and what is left out lives beside this script, in gpu_stage_deps.json:
# "staged" (name -> version: imported on the path `vllm.entrypoints.openai.api_server` ->
# engine core -> a dense Llama/Qwen2 with dummy weights, no tokenizer, token-id prompts, and
# missing from the image) and "left_out" (name -> why that path never imports it). How the
# list was found: its "method" field.

# Versions of image packages that KINDS.md's pip list row gives (the rest: name only)
IMAGE_VERSIONS = {"torch": "2.11.0", "torchvision": "0.26.0", "torchaudio": "2.11.0",
                  "transformers": "5.17.0", "tokenizers": "0.23.2", "safetensors": "0.8.0",
                  "huggingface-hub": "1.33.0", "numpy": "2.5.2", "sentencepiece": "0.2.2",
                  "tiktoken": "0.14.0", "triton": "3.6.0", "accelerate": "1.15.0"}
# The device: CPython 3.12 on Linux x86-64 (markers of Requires-Dist are evaluated for it)
DEVICE_MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3",
                  "sys_platform": "linux", "platform_system": "Linux",
                  "platform_machine": "x86_64", "implementation_name": "cpython",
                  "platform_python_implementation": "CPython", "os_name": "posix",
                  "extra": ""}

# simserve's own dependencies the image lacks (the replay client and the simulator run on the
# device beside the server)
SIMSERVE_DEPS = {"simpy": "4.1.1"}

# Files of the vLLM wheel a dense bf16 model on an H100 never loads (checked in vLLM 0.24.0's
# sources; each one is imported inside try/except or only by a path named here).
PRUNE = {
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so":
        "FlashAttention 2: on compute capability 9.0 get_flash_attn_version() picks FA3 "
        "(v1/attention/backends/fa_utils.py); flash_attn_interface.py imports FA2 in a try",
    "vllm/_moe_C_stable_libtorch.abi3.so":
        "mixture-of-experts kernels: imported in a try (platforms/cuda.py import_kernels); "
        "a dense model calls none of them",
    "vllm/vllm-rs":
        "the Rust front end binary, used only with VLLM_RUST_FRONTEND_PATH (envs.py)",
    "vllm/third_party/":
        "DeepGEMM and the SM100 FMHA sources (fp8 GEMMs, Blackwell attention), JIT-compiled "
        "only on those paths",
}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256(path: Path, chunk: int = 8 * MIB) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# Splitting and joining (tested in tests/unit/test_gpu_stage.py)


def split_file(path: Path, out_dir: Path, piece_bytes: int) -> list[dict]:
    """Cut ``path`` into ``out_dir/<name>.partNN`` of at most ``piece_bytes``; return each
    piece's name, size and SHA-256, in order."""
    if piece_bytes < 1:
        raise ValueError(f"piece size must be >= 1 byte, got {piece_bytes}")
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob(f"{path.name}.part*"):
        old.unlink()
    pieces = []
    with open(path, "rb") as f:
        k = 0
        while True:
            data = f.read(piece_bytes)
            if not data and k:
                break
            piece = out_dir / f"{path.name}.part{k:02d}"
            piece.write_bytes(data)
            pieces.append({"name": piece.name, "bytes": len(data),
                           "sha256": hashlib.sha256(data).hexdigest()})
            k += 1
            if len(data) < piece_bytes:
                break
    return pieces


def join_pieces(manifest: dict, piece_dir: Path, out: Path) -> Path:
    """Concatenate the manifest's pieces from ``piece_dir`` into ``out``, checking each piece's
    and the whole file's SHA-256. Raises ``ValueError`` naming the first piece missing or
    wrong."""
    for p in manifest["pieces"]:
        f = piece_dir / p["name"]
        if not f.exists():
            raise ValueError(f"{f}: piece missing (carry it with its own run call first)")
        if f.stat().st_size != p["bytes"] or sha256(f) != p["sha256"]:
            raise ValueError(f"{f}: SHA-256 or size differs from the manifest")
    h = hashlib.sha256()
    with open(out, "wb") as dst:
        for p in manifest["pieces"]:
            with open(piece_dir / p["name"], "rb") as src:
                while block := src.read(8 * MIB):
                    h.update(block)
                    dst.write(block)
    if h.hexdigest() != manifest["sha256"]:
        out.unlink()
        raise ValueError(f"{out}: joined SHA-256 {h.hexdigest()} != manifest "
                         f"{manifest['sha256']}")
    return out


def piece_limit(tree_bytes: int, requested_mib: float = 60.0, margin_mib: float = 2.0) -> int:
    """The largest piece that travels with the working tree in one call."""
    room = CARRY_LIMIT - tree_bytes - int(margin_mib * MIB) - 64 * 1024  # manifest, slack
    return max(1, min(int(requested_mib * MIB), room))


def tree_bytes(root: Path = ROOT) -> int:
    """Bytes of what a device call sends: tracked files plus untracked files git does not
    ignore."""
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard"], capture_output=True, check=True).stdout
    total = 0
    for name in filter(None, out.split(b"\0")):
        p = root / os.fsdecode(name)
        if p.is_file():
            total += p.stat().st_size
    return total


# --------------------------------------------------------------------------------------------
# The vLLM wheel: metadata, ELF links, pruning


def wheel_metadata(wheel: Path) -> dict:
    """Name, version and Requires-Dist (without extras) of a wheel."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    fields = {"requires": []}
    for line in text.splitlines():
        if not line.strip():
            break                                   # the body (description) follows
        key, _, value = line.partition(": ")
        if key == "Name":
            fields["name"] = value
        elif key == "Version":
            fields["version"] = value
        elif key == "Requires-Dist" and "extra ==" not in value:
            fields["requires"].append(value)
    return fields


def requirement_name(req: str) -> str:
    return norm(re.match(r"[A-Za-z0-9_.\-]+", req).group(0))


def pinned(requires: list[str], name: str) -> str | None:
    for r in requires:
        if requirement_name(r) == name:
            m = re.search(r"==\s*([^,;\s]+)", r)
            return m.group(1) if m else None
    return None


def elf_needed(wheel: Path, scratch: Path) -> dict[str, list[str]]:
    """``readelf -d`` NEEDED entries of the wheel's extension modules that name CUDA libs."""
    out = {}
    with zipfile.ZipFile(wheel) as z:
        for n in z.namelist():
            if n.endswith(".abi3.so") and "/third_party/" not in n:
                target = scratch / Path(n).name
                with z.open(n) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                text = subprocess.run(["readelf", "-d", str(target)], capture_output=True,
                                      text=True, check=True).stdout
                target.unlink()
                out[n] = sorted(set(re.findall(r"\[(lib(?:cuda|cudart)[^\]]*)\]", text)))
    return out


def pruned_wheel(wheel: Path, out_dir: Path, prune: dict[str, str]) -> tuple[Path, list[str]]:
    """``wheel`` rewritten without the files (or folders, ending in ``/``) in ``prune``; its
    RECORD lists what is left. Same file name, so pip installs it as the same version."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / wheel.name

    def dropped(name: str) -> bool:
        return any(name == p or (p.endswith("/") and name.startswith(p)) for p in prune)

    removed = []
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w") as dst:
        record = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        for info in src.infolist():
            if dropped(info.filename):
                removed.append(info.filename)
            elif info.filename != record:
                with src.open(info) as f:
                    dst.writestr(info, f.read(), compress_type=info.compress_type)
        kept = [line for line in src.read(record).decode().splitlines()
                if line and not dropped(line.split(",")[0])]
        dst.writestr(record, "\n".join(kept) + "\n", compress_type=zipfile.ZIP_DEFLATED)
    missing = [p for p in prune if not any(r == p or r.startswith(p) for r in removed)]
    if missing:
        raise ValueError(f"{wheel.name}: nothing to prune at {missing} (another vLLM layout?)")
    return out, removed


# --------------------------------------------------------------------------------------------
# Steps


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    print("+ " + " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True)


def deps_file() -> dict:
    """``gpu_stage_deps.json`` beside this script: staged, left_out, pin_overrides."""
    return json.loads((Path(__file__).with_name("gpu_stage_deps.json")).read_text())


def load_deps(stage: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The staged (name -> version) and left-out (name -> reason) lists."""
    data = deps_file()
    return data["staged"], data["left_out"]


def cmd_download(stage: Path) -> None:
    deps, _ = load_deps(stage)
    wheels = stage / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    reqs = [f"{VLLM[0]}=={VLLM[1]}", *(f"{n}=={v}" for n, v in deps.items()),
            *(f"{n}=={v}" for n, v in SIMSERVE_DEPS.items())]
    _pip("download", "--no-deps", *PLATFORM_ARGS, "-d", str(wheels), *reqs)


def _vllm_wheel(stage: Path) -> Path:
    found = sorted((stage / "wheels").glob(f"vllm-{VLLM[1]}-*.whl"))
    if not found:
        raise SystemExit(f"error: {stage}/wheels: no vllm-{VLLM[1]} wheel; run `download`")
    return found[0]


def closure_problems(wheels: list[Path], staged: dict[str, str],
                     left_out: dict[str, str]) -> tuple[list[str], list[str]]:
    """Every requirement of every staged wheel (markers evaluated for the device) must be met
    by a staged wheel's version, or by the image (by its known version where KINDS.md gives
    one), or be left out on purpose. Returns (problems, notes)."""
    from packaging.requirements import Requirement
    have = {norm(wheel_metadata(w)["name"]): wheel_metadata(w)["version"] for w in wheels}
    problems, notes = [], []
    for w in wheels:
        meta = wheel_metadata(w)
        for text in meta["requires"]:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(DEVICE_MARKERS):
                continue
            n = norm(req.name)
            who = f"{meta['name']} {meta['version']} needs {text}"
            if n in have:
                if not req.specifier.contains(have[n], prereleases=True):
                    problems.append(f"{who}; staged {n} {have[n]}")
            elif n in IMAGE_PACKAGES:
                v = IMAGE_VERSIONS.get(n)
                if v is not None and not req.specifier.contains(v, prereleases=True):
                    problems.append(f"{who}; the image has {n} {v}")
            elif n in left_out:
                notes.append(f"{who}: left out ({left_out[n]})")
            else:
                problems.append(f"{who}: neither staged, in the image, nor left out")
    missing = sorted(set(map(norm, staged)) - set(have))
    if missing:
        problems.append(f"staged but not downloaded: {missing}")
    return problems, notes


def cmd_check(stage: Path) -> dict:
    """Verify the wheel matches the image and every requirement is accounted for."""
    deps, left_out = load_deps(stage)
    wheel = _vllm_wheel(stage)
    meta = wheel_metadata(wheel)
    problems = []
    for name, version in IMAGE_TORCH.items():
        got = pinned(meta["requires"], name)
        if got != version:
            problems.append(f"Requires-Dist {name}=={got}, the image has {version}")
    scratch = stage / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    links = elf_needed(wheel, scratch)
    cudart = sorted({lib for libs in links.values() for lib in libs if "cudart" in lib})
    if cudart != [IMAGE_CUDA_RUNTIME]:
        problems.append(f"extensions link {cudart}, the image's torch has {IMAGE_CUDA_RUNTIME}")
    sorted_reqs = {"image": [], "staged": [], "left_out": [], "unaccounted": []}
    for r in meta["requires"]:
        n = requirement_name(r)
        key = ("image" if n in IMAGE_PACKAGES else "staged" if n in deps
               else "left_out" if n in left_out else "unaccounted")
        sorted_reqs[key].append(r)
    if sorted_reqs["unaccounted"]:
        problems.append(f"requirements neither in the image, staged nor left out: "
                        f"{sorted_reqs['unaccounted']}")
    from packaging.requirements import Requirement
    overrides = deps_file().get("pin_overrides", {})
    for text in meta["requires"]:
        req = Requirement(text)
        n = norm(req.name)
        if n in deps and not req.specifier.contains(deps[n], prereleases=True):
            if n in overrides:
                print(f"note: vLLM asks {text}, staged {n} {deps[n]}: {overrides[n]}")
            else:
                problems.append(f"vLLM asks {text}, staged {n} {deps[n]}")
    others = [w for w in sorted((stage / "wheels").glob("*.whl")) if w != wheel
              and norm(w.name.split("-")[0]) in {norm(n) for n in (*deps, *SIMSERVE_DEPS)}]
    closure, notes = closure_problems(others, deps, left_out)
    problems += closure
    for n in notes:
        print(f"note: {n}")
    report = {"wheel": wheel.name, "sha256": sha256(wheel), "version": meta["version"],
              "torch_pins": {n: pinned(meta["requires"], n) for n in IMAGE_TORCH},
              "cuda_runtime": cudart, "requirements": sorted_reqs}
    (stage / "check.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"{wheel.name}: torch=={report['torch_pins']['torch']}, torchvision=="
          f"{report['torch_pins']['torchvision']}, torchaudio=={report['torch_pins']['torchaudio']}"
          f"; extensions link {', '.join(cudart)}")
    print(f"requirements: {len(sorted_reqs['image'])} in the image, "
          f"{len(sorted_reqs['staged'])} staged (+ their own staged deps: "
          f"{len(deps) - len(sorted_reqs['staged'])}), {len(sorted_reqs['left_out'])} left out")
    if problems:
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        raise SystemExit(2)
    return report


def cmd_pack(stage: Path, piece_mib: float) -> dict:
    deps, _ = load_deps(stage)
    wheel = _vllm_wheel(stage)
    slim, removed = pruned_wheel(wheel, stage / "pruned", PRUNE)
    wanted = {norm(n) for n in (*deps, *SIMSERVE_DEPS)}
    others = [w for w in sorted((stage / "wheels").glob("*.whl"))
              if norm(w.name.split("-")[0]) in wanted]
    found = {norm(w.name.split("-")[0]) for w in others}
    if found != wanted:
        raise SystemExit(f"error: {stage}/wheels lacks {sorted(wanted - found)}; run `download`")
    tar_path = stage / TAR_NAME
    with tarfile.open(tar_path, "w", format=tarfile.GNU_FORMAT) as tar:
        for w in [slim, *others]:
            info = tar.gettarinfo(str(w), arcname=f"wheels/{w.name}")
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with open(w, "rb") as f:
                tar.addfile(info, f)
    limit = piece_limit(tree_bytes(), piece_mib)
    pieces = split_file(tar_path, stage / "pieces", limit)
    manifest = {"tar": TAR_NAME, "bytes": tar_path.stat().st_size, "sha256": sha256(tar_path),
                "piece_bytes": limit, "pieces": pieces,
                "vllm": {"version": VLLM[1], "wheel": wheel.name, "wheel_sha256": sha256(wheel),
                         "pruned": removed, "prune_reasons": PRUNE},
                "wheels": [slim.name, *(w.name for w in others)]}
    (stage / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    tar_path.unlink()           # the pieces hold it; keep the stage small
    print(f"{len(manifest['wheels'])} wheels, {manifest['bytes'] / MIB:.1f} MiB in "
          f"{len(pieces)} pieces of <= {limit / MIB:.1f} MiB under {stage / 'pieces'}; "
          f"pruned {len(removed)} files from the vLLM wheel")
    return manifest


def plan_calls(manifest: dict, stage_rel: str = ".gpu-stage") -> list[dict]:
    """The device calls that carry the pieces back to back, then install and import vLLM."""
    calls = []
    n = len(manifest["pieces"])
    for k, p in enumerate(manifest["pieces"]):
        carry = [f"{stage_rel}/pieces/{p['name']}"] + ([f"{stage_rel}/manifest.json"]
                                                       if k == 0 else [])
        cmd = f"python3 benchmarks/gpu_stage_vllm.py receive {stage_rel}/pieces/{p['name']}"
        if k == 0:
            cmd = (f"nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; "
                   f"python3 benchmarks/gpu_stage_vllm.py receive-manifest "
                   f"{stage_rel}/manifest.json && " + cmd)
        if k == n - 1:
            cmd += " && python3 benchmarks/gpu_stage_vllm.py install"
        calls.append({"carry": carry, "command": cmd, "timeout_s": 300})
    return calls


def cmd_plan(stage: Path) -> None:
    manifest = json.loads((stage / "manifest.json").read_text())
    print(f"# {len(manifest['pieces'])} device calls, back to back (a warm machine keeps "
          f"{DEVICE_STAGE} only 30 s after a call returns):")
    for k, call in enumerate(plan_calls(manifest), 1):
        print(f"run {k}: carry={json.dumps(call['carry'])} timeout_s={call['timeout_s']}")
        print(f"        command: {call['command']}")
    print(f"# then every call that needs vLLM starts with: export PYTHONPATH={DEVICE_SITE}:$PWD")


# --------------------------------------------------------------------------------------------
# Device side (rehearsed locally with --device-stage/--site pointing into a scratch dir)


def cmd_receive_manifest(path: Path, device_stage: Path) -> None:
    device_stage.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, device_stage / "manifest.json")
    print(f"manifest -> {device_stage}")


def cmd_receive(piece: Path, device_stage: Path) -> None:
    manifest = json.loads((device_stage / "manifest.json").read_text())
    entry = next((p for p in manifest["pieces"] if p["name"] == piece.name), None)
    if entry is None:
        raise SystemExit(f"error: {piece}: not a piece of {device_stage}/manifest.json")
    if not piece.exists():
        raise SystemExit(f"error: {piece}: not carried (name it in the call's carry list)")
    if sha256(piece) != entry["sha256"]:
        raise SystemExit(f"error: {piece}: SHA-256 differs from the manifest (a broken "
                         f"transfer?); carry it again")
    shutil.move(str(piece), device_stage / piece.name)
    have = sum((device_stage / p["name"]).exists() for p in manifest["pieces"])
    print(f"{piece.name} ok -> {device_stage} ({have}/{len(manifest['pieces'])} pieces there)")


def cmd_install(device_stage: Path, site: Path, python: str = "python3",
                import_check: bool = True) -> None:
    manifest = json.loads((device_stage / "manifest.json").read_text())
    try:
        tar_path = join_pieces(manifest, device_stage, device_stage / manifest["tar"])
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    with tarfile.open(tar_path) as tar:
        tar.extractall(device_stage, filter="data")
    wheels = [str(device_stage / "wheels" / w) for w in manifest["wheels"]]
    r = subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site),
                        *wheels])
    if r.returncode:
        raise SystemExit(f"error: pip install --target {site} failed (exit {r.returncode}); "
                         f"the pieces are still in {device_stage}")
    for p in [tar_path, *(device_stage / p["name"] for p in manifest["pieces"])]:
        p.unlink(missing_ok=True)          # the machine's disk, not the carry: tidy only
    print(f"installed {len(wheels)} wheels into {site}")
    if import_check:
        check_device_imports(python, site)


# The modules a dense Llama/Qwen2 server process imports (API server, engine core, GPU worker,
# model, attention backend, sampler, dummy loader, structured-output manager, compiler glue)
IMPORT_CHECK_MODULES = (
    "vllm.entrypoints.openai.api_server", "vllm.v1.engine.core", "vllm.v1.engine.core_client",
    "vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu_model_runner",
    "vllm.model_executor.models.llama", "vllm.model_executor.models.qwen2",
    "vllm.v1.attention.backends.flash_attn", "vllm.v1.sample.sampler",
    "vllm.model_executor.model_loader.dummy_loader", "vllm.v1.structured_output",
    "vllm.compilation.backends", "vllm.compilation.cuda_graph", "vllm.v1.core.sched.scheduler",
)

_IMPORT_PROBE = """
import importlib, json, sys, traceback
missing, other = {}, {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        missing.setdefault((e.name or "?").split(".")[0], []).append(name)
    except Exception as e:  # a CUDA-only module on a machine without CUDA, say
        other[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
print(json.dumps({"missing": missing, "other": other}))
"""


def cmd_imports(python: str, site: Path, extra: tuple[str, ...] = ()) -> dict:
    """Import :data:`IMPORT_CHECK_MODULES` with ``python`` and ``site`` first on its path, and
    report the top-level modules that are missing (``ModuleNotFoundError``), by the module that
    needed them. Rehearsal: a Python holding only the image's packages (no CUDA) and the staged
    wheels installed into ``site``."""
    env = {**os.environ, "PYTHONPATH": str(site), "VLLM_LOGGING_LEVEL": "ERROR"}
    r = subprocess.run([python, "-c", _IMPORT_PROBE, *IMPORT_CHECK_MODULES, *extra], env=env,
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"error: the import probe failed:\n{r.stderr[-2000:]}")
    report = json.loads(r.stdout.strip().splitlines()[-1])
    for mod, needers in sorted(report["missing"].items()):
        print(f"missing module {mod!r} (needed by {', '.join(needers)})")
    for name, err in sorted(report["other"].items()):
        print(f"{name}: {err}")
    if not report["missing"]:
        print(f"all {len(IMPORT_CHECK_MODULES)} modules import, or fail for a reason other than "
              f"a missing package")
    return report


def check_device_imports(python: str, site: Path) -> None:
    """On the device, after installing: every serving-path module imports (all missing
    packages named at once, so one call tells everything), vLLM's CUDA kernels load, FA3 is
    supported."""
    report = cmd_imports(python, site, extra=("vllm.platforms.cuda", "vllm._C_stable_libtorch"))
    env = {**os.environ, "PYTHONPATH": f"{site}:{ROOT}"}
    code = ("import torch, vllm, simpy; print('vllm', vllm.__version__, 'torch', "
            "torch.__version__, 'cuda', torch.cuda.is_available()); "
            "from vllm.vllm_flash_attn.flash_attn_interface import is_fa_version_supported;"
            " print('FA3 supported:', is_fa_version_supported(3))")
    r = subprocess.run([python, "-c", code], env=env)
    if r.returncode or report["missing"] or report["other"]:
        raise SystemExit(f"error: vLLM is installed in {site} but does not import cleanly (see "
                         f"above); a missing small package: download its wheel here, carry it "
                         f"in .gpu-stage/extra/ and run `gpu_stage_vllm.py install-extra "
                         f".gpu-stage/extra`")


def cmd_install_extra(folder: Path, site: Path, python: str) -> None:
    """Install the wheels of ``folder`` (carried later, for a package found missing) into
    ``site``."""
    wheels = sorted(str(w) for w in folder.glob("*.whl"))
    if not wheels:
        raise SystemExit(f"error: {folder}: no wheels (carry the folder with the call)")
    r = subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--no-compile", "--no-cache-dir", "--target", str(site), *wheels])
    if r.returncode:
        raise SystemExit(f"error: pip install --target {site} failed (exit {r.returncode})")
    print(f"installed {len(wheels)} extra wheels into {site}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("steps", nargs="+", help="download check pack plan | receive-manifest PATH "
                    "| receive PIECE | install | install-extra DIR | imports")
    ap.add_argument("--stage", type=Path, default=STAGE)
    ap.add_argument("--piece-mib", type=float, default=60.0)
    ap.add_argument("--device-stage", type=Path, default=DEVICE_STAGE)
    ap.add_argument("--site", type=Path, default=DEVICE_SITE)
    ap.add_argument("--python", default="python3", help="the interpreter that installs "
                    "(device: python3)")
    ap.add_argument("--no-import-check", action="store_true")
    args = ap.parse_args(argv)
    steps = list(args.steps)
    while steps:
        step = steps.pop(0)
        if step == "download":
            cmd_download(args.stage)
        elif step == "check":
            cmd_check(args.stage)
        elif step == "pack":
            cmd_pack(args.stage, args.piece_mib)
        elif step == "plan":
            cmd_plan(args.stage)
        elif step in ("receive", "receive-manifest"):
            if not steps:
                ap.error(f"{step} needs a path")
            path = Path(steps.pop(0))
            (cmd_receive if step == "receive" else cmd_receive_manifest)(path, args.device_stage)
        elif step == "imports":
            cmd_imports(args.python, args.site)
        elif step == "install-extra":
            if not steps:
                ap.error("install-extra needs a folder")
            cmd_install_extra(Path(steps.pop(0)), args.site, args.python)
        elif step == "install":
            cmd_install(args.device_stage, args.site, args.python, not args.no_import_check)
        else:
            ap.error(f"unknown step {step!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
