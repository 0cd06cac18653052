"""What a newcomer meets first (issue #33 item 6): a sweep file given to `run`, the listings,
attainment shown one way, folder names of inline cards, docs that need no outside folder."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import yaml

from simserve.cli import main
from simserve.fmt import format_table

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "tiny.yaml"


def test_run_and_capacity_on_a_sweep_file_name_it_and_the_command(capsys):
    path = ROOT / "scenarios" / "sweep_rate.yaml"
    for command in ("run", "capacity"):
        assert main([command, str(path), "--no-report"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is a sweep file" in err
        assert f"simserve sweep {path}" in err and "model: is required" not in err


def test_sweep_on_a_scenario_file_names_the_command(capsys):
    path = ROOT / "scenarios" / "quickstart.yaml"
    assert main(["sweep", str(path), "--no-report"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"simserve run {path}" in err


def test_list_says_what_each_entry_is(capsys):
    assert main(["list", "models"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines()
                if x.startswith("Llama-3.1-8B "))
    assert "8.03B parameters" in line and "weights 16.1 GB" in line and "128 KiB a token" in line
    assert main(["list", "hardware"]) == 0
    lines = {x.split()[0]: x for x in capsys.readouterr().out.splitlines()}
    line = lines["H100-SXM"]
    assert "80 GB memory at 3.35 TB/s" in line and "989 TFLOP/s" in line
    # what times each card and what `simserve plan` costs it at (the plan depends on both)
    assert line.endswith("step times: h100-vllm curves, fitted to measured vLLM runs on "
                         "H100-SXM; plan price $2.25/GPU-hour (default)")
    assert "h100-vllm curves, fitted to measured vLLM runs on H100-SXM (transferred)" \
        in lines["H200"]
    assert lines["H200"].endswith("; no plan price (simserve plan needs one: plan.prices)")
    assert "step times: spec sheet, an estimate; plan price $0.87" in lines["L40S"]
    assert "step times: a100 curves, an estimate; plan price $1.49" in lines["A100-80GB"]
    assert main(["list", "policies"]) == 0
    lines = dict(re.split(r"\s{2,}", x, maxsplit=1)
                 for x in capsys.readouterr().out.splitlines())
    assert all(len(v) > 20 for v in lines.values())
    assert lines["trtllm_guaranteed_no_evict"] != lines["trtllm_max_utilization"]


def test_attainment_is_a_percentage_in_every_table():
    table = pd.DataFrame({"SLO attainment": [0.887, None], "meets target": [True, False]})
    text = format_table(table)
    assert "SLO attainment (%)" in text and "88.7" in text and "0.887" not in text


def test_capacity_and_compare_tables_show_attainment_as_the_summary_does(tmp_path, capsys):
    assert main(["capacity", str(TINY), "--seeds", "1", "--quiet", "--no-report",
                 "--out", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "min attainment (%)" in out and "target attainment 90%" in out
    assert re.search(r"attainment at max rate over seeds: min \d+\.\d%", out)


def test_inline_card_variants_get_their_names_as_folders(tmp_path, capsys):
    raw = yaml.safe_load(TINY.read_text())
    raw["workload"]["num_requests"] = 10
    card = {"name": "H100 / 80 GB (custom)", "kind": "gpu", "peak_flops": 989e12,
            "mem_bandwidth": 3.35e12, "mem_bytes": 80e9, "interconnect_bandwidth": 450e9,
            "host_link_bandwidth": 64e9}
    raw["compare"] = {"hardware": [card, {**card, "name": "H100 half bandwidth",
                                          "mem_bandwidth": 1.675e12}]}
    path = tmp_path / "inline.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--quiet", "--no-report"]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in (tmp_path / "o").iterdir() if p.is_dir()) == \
        ["H100_80_GB_custom", "H100_half_bandwidth"]


def test_docs_and_scenarios_do_not_send_users_to_a_folder_outside_the_repository():
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
             *(ROOT / "scenarios").glob("*.yaml"), *(ROOT / "simserve").rglob("*.py"),
             *(ROOT / "simserve" / "data").rglob("*.yaml")]
    offenders = [str(p.relative_to(ROOT)) for p in files
                 if "shared/truth" in p.read_text(encoding="utf-8")]
    assert offenders == []


def test_readme_says_what_make_test_installs_and_how_long_it_takes():
    """issue #33 item 7: the extras `make test` installs (the Makefile's dev install) are named
    in the README beside the size they take and the time the suite runs."""
    make = (ROOT / "Makefile").read_text()
    extras = re.search(r"pip install -q -e '\.\[([a-z,]+)\]'", make).group(1).split(",")
    heavy = {"profile": "torch", "ray": "Ray", "parquet": "pyarrow"}
    readme = (ROOT / "README.md").read_text()
    paragraph = next(p for p in readme.split("\n\n") if p.startswith("`make test`"))
    assert re.search(r"\d(\.\d)? GB", paragraph) and "minutes" in paragraph
    for extra in extras:
        if extra in heavy:
            assert heavy[extra] in paragraph, extra


def test_a_sweep_over_inline_cards_shows_their_names(tmp_path, capsys):
    card = {"name": "H100-custom", "kind": "gpu", "peak_flops": 989e12, "mem_bandwidth": 3.35e12,
            "mem_bytes": 80e9, "interconnect_bandwidth": 450e9, "host_link_bandwidth": 64e9}
    grid = {"base": str(TINY), "set": {"workload.num_requests": 10},
            "grid": {"hardware": [card, {**card, "name": "H100-slow", "mem_bandwidth": 1e12}]}}
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(grid))
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--workers", "1",
                 "--no-report"]) == 0
    out = capsys.readouterr().out
    assert "H100-custom" in out and "H100-slow" in out and "peak_flops" not in out


def test_report_on_a_folder_of_several_outputs_names_them_instead_of_comparing_runs(tmp_path,
                                                                                     capsys):
    """`simserve report runs` (the folder every command writes into) made a 'Policy comparison'
    of whichever subfolders were single runs, of different scenarios, and silently left out
    the compare, sweep and capacity folders beside them; it now says to name the outputs."""
    runs = tmp_path / "runs"
    assert main(["run", str(TINY), "--out", str(runs / "tiny"), "--quiet", "--no-report"]) == 0
    assert main(["capacity", str(TINY), "--seeds", "1", "--quiet", "--no-report",
                 "--out", str(runs / "tiny-capacity")]) == 0
    capsys.readouterr()
    assert main(["report", str(runs)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tiny-capacity" in err and "simserve report" in err
    assert not (runs / "report.html").exists() and not (runs / "figures").exists()
    # a folder of runs alone (no comparison.csv, nothing else beside them) is still a compare
    import shutil
    for name in ("a", "b"):
        shutil.copytree(runs / "tiny", tmp_path / "only" / name)
    assert main(["report", str(tmp_path / "only")]) == 0
    assert (tmp_path / "only" / "report.html").is_file()
