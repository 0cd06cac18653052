"""benchmarks/gpu_stage_vllm.py: splitting, joining and checksums, the pruned wheel, the device
side's receive/install (with a small fake wheel and the real pip), and the call plan."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gpu_stage_vllm",
                                              REPO / "benchmarks" / "gpu_stage_vllm.py")
stage = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stage)


def fake_file(path: Path, size: int, seed: int = 0) -> bytes:
    data = hashlib.sha256(str(seed).encode()).digest() * (size // 32 + 1)
    data = data[:size]
    path.write_bytes(data)
    return data


@pytest.mark.parametrize("size,piece", [(1000, 300), (900, 300), (5, 300), (0, 300)])
def test_split_then_join_gives_the_same_bytes(tmp_path, size, piece):
    data = fake_file(tmp_path / "blob.tar", size)
    pieces = stage.split_file(tmp_path / "blob.tar", tmp_path / "pieces", piece)
    # ceil(size / piece) pieces (one, empty, for an empty file), none above the limit
    assert len(pieces) == max(1, -(-size // piece))
    assert all(p["bytes"] <= piece for p in pieces)
    assert sum(p["bytes"] for p in pieces) == size
    manifest = {"pieces": pieces, "sha256": hashlib.sha256(data).hexdigest()}
    out = stage.join_pieces(manifest, tmp_path / "pieces", tmp_path / "joined")
    assert out.read_bytes() == data


def test_join_names_a_missing_or_corrupt_piece(tmp_path):
    data = fake_file(tmp_path / "blob.tar", 1000)
    pieces = stage.split_file(tmp_path / "blob.tar", tmp_path / "p", 400)
    manifest = {"pieces": pieces, "sha256": hashlib.sha256(data).hexdigest()}
    (tmp_path / "p" / pieces[1]["name"]).unlink()
    with pytest.raises(ValueError, match=r"part01: piece missing"):
        stage.join_pieces(manifest, tmp_path / "p", tmp_path / "joined")
    stage.split_file(tmp_path / "blob.tar", tmp_path / "p", 400)
    broken = tmp_path / "p" / pieces[2]["name"]
    broken.write_bytes(b"x" + broken.read_bytes()[1:])
    with pytest.raises(ValueError, match=r"part02: SHA-256 or size differs"):
        stage.join_pieces(manifest, tmp_path / "p", tmp_path / "joined")
    # a manifest whose whole-file checksum is wrong: the joined file is removed
    stage.split_file(tmp_path / "blob.tar", tmp_path / "p", 400)
    with pytest.raises(ValueError, match="joined SHA-256"):
        stage.join_pieces({**manifest, "sha256": "0" * 64}, tmp_path / "p", tmp_path / "j2")
    assert not (tmp_path / "j2").exists()


def test_piece_limit_leaves_room_for_the_working_tree():
    mib = stage.MIB
    assert stage.piece_limit(1 * mib) == 60 * mib                 # the requested 60 MiB fit
    # a 10 MiB tree: 64 - 10 - 2 (margin) MiB - 64 KiB
    assert stage.piece_limit(10 * mib) == 52 * mib - 64 * 1024
    assert stage.piece_limit(10 * mib) + 10 * mib < stage.CARRY_LIMIT


def make_wheel(path: Path, name: str, version: str, files: dict[str, bytes],
               requires: list[str] = ()) -> Path:
    """A minimal valid wheel (METADATA, WHEEL, RECORD with hashes)."""
    dist = f"{name}-{version}.dist-info"
    meta = "\n".join(["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
                      *(f"Requires-Dist: {r}" for r in requires), "", "A description.",
                      "Requires-Dist: not-a-field (in the body)"]) + "\n"
    entries = {**files, f"{dist}/METADATA": meta.encode(),
               f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                b"Tag: py3-none-any\n"}
    record = []
    for n, data in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{n},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    whl = path / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as z:
        for n, data in entries.items():
            z.writestr(n, data)
        z.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return whl


def test_wheel_metadata_reads_pins_without_extras(tmp_path):
    whl = make_wheel(tmp_path, "fakevllm", "0.24.0", {"fakevllm/__init__.py": b""},
                     ["torch==2.11.0", "torchvision==0.26.0", "fastapi[standard]<0.137,>=0.133",
                      'tensorizer==2.10.1; extra == "tensorizer"'])
    meta = stage.wheel_metadata(whl)
    assert (meta["name"], meta["version"]) == ("fakevllm", "0.24.0")
    assert len(meta["requires"]) == 3                   # the extra and the body are not fields
    assert stage.pinned(meta["requires"], "torch") == "2.11.0"
    assert stage.pinned(meta["requires"], "fastapi") is None
    assert stage.requirement_name("fastapi[standard]<0.137") == "fastapi"


def test_pruned_wheel_drops_files_and_their_record_lines(tmp_path):
    whl = make_wheel(tmp_path, "fakevllm", "0.24.0", {
        "fakevllm/__init__.py": b"VERSION = 1\n", "fakevllm/big_fa2.so": b"\0" * 100,
        "fakevllm/third_party/a.hpp": b"x", "fakevllm/third_party/b/c.hpp": b"y"})
    prune = {"fakevllm/big_fa2.so": "unused", "fakevllm/third_party/": "unused"}
    out, removed = stage.pruned_wheel(whl, tmp_path / "pruned", prune)
    assert sorted(removed) == ["fakevllm/big_fa2.so", "fakevllm/third_party/a.hpp",
                               "fakevllm/third_party/b/c.hpp"]
    with zipfile.ZipFile(out) as z:
        names = z.namelist()
        record = z.read("fakevllm-0.24.0.dist-info/RECORD").decode()
    assert "fakevllm/__init__.py" in names and not any("third_party" in n for n in names)
    assert "big_fa2" not in record and "third_party" not in record
    assert "fakevllm/__init__.py,sha256=" in record
    with pytest.raises(ValueError, match="nothing to prune"):
        stage.pruned_wheel(whl, tmp_path / "p2", {"fakevllm/absent.so": "?"})


def test_receive_and_install_on_the_device_side_rehearsed_with_pip(tmp_path, monkeypatch):
    """The device's steps, here: pieces of a tar of two wheels, received one by one (each
    checked), joined, checked, installed with pip --no-index --no-deps --target, imported."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    a = make_wheel(wheels, "stagedpkg", "1.0", {"stagedpkg/__init__.py": b"ANSWER = 42\n"})
    b = make_wheel(wheels, "otherpkg", "2.0", {"otherpkg/__init__.py": b"NAME = 'x'\n"})
    import tarfile
    tar_path = tmp_path / stage.TAR_NAME
    with tarfile.open(tar_path, "w") as tar:
        for w in (a, b):
            tar.add(w, arcname=f"wheels/{w.name}")
    pieces = stage.split_file(tar_path, tmp_path / "carried", 1500)
    assert len(pieces) >= 2
    manifest = {"tar": stage.TAR_NAME, "sha256": stage.sha256(tar_path), "pieces": pieces,
                "wheels": [a.name, b.name]}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    dev = tmp_path / "device-stage"
    stage.cmd_receive_manifest(tmp_path / "manifest.json", dev)
    for p in pieces:
        stage.cmd_receive(tmp_path / "carried" / p["name"], dev)
        assert not (tmp_path / "carried" / p["name"]).exists()     # moved out of the tree
    site = tmp_path / "site"
    stage.cmd_install(dev, site, python=sys.executable, import_check=False)
    out = subprocess.run([sys.executable, "-c", "import stagedpkg, otherpkg; "
                          "print(stagedpkg.ANSWER, otherpkg.NAME)"], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(site)})
    assert out.stdout.split() == ["42", "x"]


def test_receive_refuses_a_corrupt_piece(tmp_path):
    fake_file(tmp_path / "t.tar", 100)
    pieces = stage.split_file(tmp_path / "t.tar", tmp_path / "c", 60)
    (tmp_path / "manifest.json").write_text(json.dumps({"pieces": pieces}))
    stage.cmd_receive_manifest(tmp_path / "manifest.json", tmp_path / "dev")
    (tmp_path / "c" / pieces[0]["name"]).write_bytes(b"junk")
    with pytest.raises(SystemExit, match="SHA-256 differs"):
        stage.cmd_receive(tmp_path / "c" / pieces[0]["name"], tmp_path / "dev")


def test_plan_carries_one_piece_per_call_and_installs_in_the_last():
    manifest = {"pieces": [{"name": f"vllm-stage.tar.part{k:02d}"} for k in range(3)]}
    calls = stage.plan_calls(manifest)
    assert [c["carry"] for c in calls] == [
        [".gpu-stage/pieces/vllm-stage.tar.part00", ".gpu-stage/manifest.json"],
        [".gpu-stage/pieces/vllm-stage.tar.part01"],
        [".gpu-stage/pieces/vllm-stage.tar.part02"]]
    assert "receive-manifest" in calls[0]["command"]
    assert all("install" not in c["command"].split("&&")[-1] for c in calls[:-1])
    assert calls[-1]["command"].endswith("gpu_stage_vllm.py install")
    assert all(len(c["command"]) <= 2000 for c in calls)        # the run tool's limit


def test_every_staged_or_left_out_name_is_outside_the_image():
    staged, left_out = stage.load_deps(stage.STAGE)
    assert staged and left_out
    for name in [*staged, *left_out]:
        assert stage.norm(name) == name and name not in stage.IMAGE_PACKAGES, name
    assert not set(staged) & set(left_out)
    assert all(reason.strip() for reason in left_out.values())


def test_install_extra_adds_carried_wheels_and_refuses_an_empty_folder(tmp_path):
    extra = tmp_path / "extra"
    extra.mkdir()
    with pytest.raises(SystemExit, match="no wheels"):
        stage.cmd_install_extra(extra, tmp_path / "site", sys.executable)
    make_wheel(extra, "latepkg", "0.1", {"latepkg/__init__.py": b"X = 7\n"})
    stage.cmd_install_extra(extra, tmp_path / "site", sys.executable)
    out = subprocess.run([sys.executable, "-c", "import latepkg; print(latepkg.X)"],
                         capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "site")})
    assert out.stdout.strip() == "7"
