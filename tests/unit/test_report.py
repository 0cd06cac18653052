"""Reports: files, a self-contained HTML page, figure counts, colours, binning, and the CLI."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import simserve
from simserve.plan.capacity import capacity
from simserve.cli import main
from simserve.errors import DataError, SimserveError
from simserve.report import POLICY_COLORS, RunData, load_inputs, policy_color, write_report
from simserve.report.figures import SHARED_KNEE_COLOR, Curve, _binned
from simserve.report.style import series_styles
from simserve.plan.sweep import load_sweep, save_sweep, sweep

DATA = Path(__file__).resolve().parents[1] / "data"
TINY = DATA / "tiny.yaml"
IMG = re.compile(r"<img [^>]*src=\"([^\"]*)\"")


def tiny_run(out: Path, **overrides) -> Path:
    sets = [f"{k}={v}" for k, v in {"workload.num_requests": 30, **overrides}.items()]
    return simserve.run(TINY, overrides=sets).save(out)


def check_self_contained(html_path: Path) -> list[str]:
    """The page needs nothing from the network: no http(s) anywhere, no external scripts or
    stylesheets, every image a PNG data: URI. Returns the image sources."""
    page = html_path.read_text()
    assert "http://" not in page and "https://" not in page
    assert "<link" not in page and "<script" not in page
    sources = IMG.findall(page)
    for src in sources:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    return sources


def test_single_run_report(tmp_path):
    run_dir = tiny_run(tmp_path / "run")
    path = write_report([run_dir])
    assert path == run_dir / "report.html"
    sources = check_self_contained(path)
    pngs = sorted(p.name for p in (run_dir / "figures").glob("*.png"))
    assert pngs == ["latency_cdf.png", "timeline_run.png"]
    assert len(sources) == len(pngs)
    page = path.read_text()
    assert "Run: run" in page and "TTFT p99 ms" in page and "vllm_v1" in page


def test_compare_run_from_the_cli_reports_every_variant(tmp_path, capsys):
    src = TINY.read_text() + "compare:\n  scheduler.policy: [vllm_v0, sarathi, static]\n"
    (tmp_path / "cmp.yaml").write_text(src)
    out = tmp_path / "o"
    code = main(["run", str(tmp_path / "cmp.yaml"), "--out", str(out), "--quiet", "--svg",
                 "--set", "workload.num_requests=30"])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    assert f"report: {out / 'report.html'}" in stdout
    sources = check_self_contained(out / "report.html")
    # CDFs + bars + one timeline per variant
    assert len(sources) == 2 + 3
    assert len(list((out / "figures").glob("*.svg"))) == 5
    page = (out / "report.html").read_text()
    assert page.index("vllm_v0") < page.index("sarathi") < page.index("static")  # file order
    assert "Overrides: --set workload.num_requests=30." in page   # what made these runs
    assert "<h2>Policy comparison</h2>" in page


def test_a_comparison_of_one_policys_runs_is_not_called_a_policy_comparison(tmp_path):
    from simserve.report.build import runs_section
    tiny_run(tmp_path / "slow")
    tiny_run(tmp_path / "fast", **{"workload.rate": 40})
    inputs = load_inputs([tmp_path / "slow", tmp_path / "fast"])
    sec = runs_section(inputs.runs)
    assert sec.title == "Comparison of 2 vllm_v1 runs"
    (name, caption, fig), = [f for f in sec.figures if f[0] == "policy_bars"]
    assert "runs of one policy differ by hatch" in caption
    assert fig._suptitle.get_text() == "Comparison of 2 vllm_v1 runs"
    # more runs than hatches: the caption does not promise them
    for rate in (10, 30, 50):
        tiny_run(tmp_path / f"r{rate}", **{"workload.rate": rate})
    five = load_inputs([tmp_path / d for d in ("slow", "fast", "r10", "r30", "r50")]).runs
    caption = next(c for n, c, _ in runs_section(five).figures if n == "policy_bars")
    assert "hatch" not in caption


@pytest.mark.parametrize("override", ["scheduler.policy=tgi", "scheduler={policy: tgi}"])
def test_a_set_field_that_a_compare_variant_sets_too_is_refused(tmp_path, capsys, override):
    # the variant's value would win while every output's header says the override applied
    src = TINY.read_text() + ("compare:\n  - {label: v0, workload.rate: 5}\n"
                              "  - {label: sar, scheduler.policy: sarathi}\n")
    (tmp_path / "cmp.yaml").write_text(src)
    out = tmp_path / "o"
    assert main(["run", str(tmp_path / "cmp.yaml"), "--out", str(out), "--quiet",
                 "--set", override]) == 2
    err = capsys.readouterr().err
    key = override.partition("=")[0]
    assert err == (f"error: --set {key}: compare variant 'sar' sets scheduler.policy itself, "
                   "so the override would not apply; remove it from --set or from compare:\n")
    assert not out.exists()
    # a field no variant sets is still applied to every variant, and so is a section whose
    # override gives no field a variant sets
    assert main(["validate", str(tmp_path / "cmp.yaml"), "--set", "workload.num_requests=10"]) == 0
    assert main(["validate", str(tmp_path / "cmp.yaml"), "--set", "scheduler={}"]) == 0


def test_set_overrides_are_named_and_never_clobber_the_plain_run(tmp_path, capsys,
                                                                  monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(TINY), "--no-report", "--quiet"]) == 0
    assert main(["run", str(TINY), "--no-report", "--quiet",
                 "--set", "workload.rate=40"]) == 0
    plain, other = tmp_path / "runs" / "tiny", tmp_path / "runs" / "tiny+workload.rate=40"
    assert "rate: 20" in (plain / "scenario.yaml").read_text()          # untouched
    text = (other / "scenario.yaml").read_text()
    assert text.startswith("# resolved with these overrides") and "# --set workload.rate=40\n" \
        in text and "rate: 40" in text
    capsys.readouterr()
    # the same folder given twice for different scenarios: replaced, and said so
    assert main(["run", str(TINY), "--no-report", "--quiet", "--out", str(plain),
                 "--set", "seed=3"]) == 0
    err = capsys.readouterr().err
    assert f"note: replacing the results of a different scenario in {plain}/ (seed: 7 → 3)" \
        in err


def test_an_output_of_another_kind_in_the_folder_is_replaced_and_said(tmp_path, capsys):
    """A compare written where a run was kept the run's summary.json, which the report then
    read as the folder's only run ("1 run(s)"); a run written into a compare's folder, a
    compare into another compare's, a sweep or capacity search into a run's all left the
    earlier files to be reported. Each now removes what another output wrote there, says so,
    and leaves anything simserve did not write."""
    cmp_yaml = tmp_path / "cmp.yaml"
    cmp_yaml.write_text(TINY.read_text() + "compare:\n  scheduler.policy: [vllm_v0, sarathi]\n")
    out = tmp_path / "o"
    n = ["--set", "workload.num_requests=20", "--quiet"]
    assert main(["run", str(TINY), "--out", str(out), "--no-report", *n]) == 0
    (out / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main(["run", str(cmp_yaml), "--out", str(out), *n]) == 0
    err = capsys.readouterr().err
    assert err.count("note: ") == 1 and (
        f"note: replacing the results of a run in {out}/ with a compare's (removed "
        "scenario.yaml, summary.json, requests.csv, steps.csv)") in err
    assert not (out / "summary.json").exists() and (out / "notes.txt").read_text() == "mine"
    assert "<h2>Policy comparison</h2>" in (out / "report.html").read_text()
    assert [r.label for r in load_inputs([out]).runs] == ["vllm_v0", "sarathi"]
    # a compare of other variants: the earlier compare's folders go (a file of the user's in
    # one keeps that folder, without the run)
    (out / "sarathi" / "keep.txt").write_text("mine")
    other = tmp_path / "other.yaml"
    other.write_text(TINY.read_text() + "compare:\n  scheduler.policy: [static, vllm_v0]\n")
    assert main(["run", str(other), "--out", str(out), "--no-report", *n]) == 0
    err = capsys.readouterr().err
    assert (f"note: replacing the results of another compare in {out}/ with a compare's "
            "(removed 1 variant folder(s): sarathi)") in err
    assert sorted(p.name for p in (out / "sarathi").iterdir()) == ["keep.txt"]
    assert [r.label for r in load_inputs([out]).runs] == ["static", "vllm_v0"]
    # a run into the compare's folder: its variant folders go with comparison.csv
    assert main(["run", str(TINY), "--out", str(out), "--no-report", *n]) == 0
    err = capsys.readouterr().err
    assert (f"note: replacing the results of a compare in {out}/ with a run's (removed "
            "comparison.csv; 2 variant folder(s): static, vllm_v0)") in err
    assert sorted(p.name for p in out.iterdir()) == [
        "notes.txt", "requests.csv", "sarathi", "scenario.yaml", "steps.csv", "summary.json"]
    # a capacity search into a run's folder, then a run again: each says what it replaced
    assert main(["capacity", str(TINY), "--seeds", "1", "--out", str(out), "--quiet",
                 "--no-report"]) == 0
    assert (f"note: replacing the results of a run in {out}/ with a capacity search's "
            "(removed scenario.yaml, summary.json, requests.csv, steps.csv)") \
        in capsys.readouterr().err
    assert load_inputs([out]).capacities and not load_inputs([out]).runs
    assert main(["run", str(TINY), "--out", str(out), "--no-report", *n]) == 0
    assert (f"note: replacing the results of a capacity search in {out}/ with a run's "
            "(removed capacity.json, probes.csv)") in capsys.readouterr().err
    # the same kind again says nothing new; a folder of the user's runs is left alone
    assert main(["run", str(TINY), "--out", str(out), "--no-report", *n]) == 0
    assert "note:" not in capsys.readouterr().err
    runs = tmp_path / "runs"
    tiny_run(runs / "a")
    assert main(["run", str(TINY), "--out", str(runs), "--no-report", *n]) == 0
    assert (runs / "a" / "summary.json").is_file()


def test_replacing_another_output_removes_only_what_simserve_wrote(tmp_path, capsys):
    """What a review of the replacement found: files of the user's that share an output's
    names, a variant folder that is a link elsewhere, an unreadable comparison.csv, labels
    that are not folder names."""
    n = ["--set", "workload.num_requests=20", "--quiet", "--no-report"]
    # the user's files named like an output's, with no output there: all kept
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "scenario.yaml").write_text(TINY.read_text())
    for name in ("requests.csv", "sweep.yaml", "probes.csv"):
        (mine / name).write_text("mine")
    assert main(["capacity", str(mine / "scenario.yaml"), "--seeds", "1", "--out", str(mine),
                 "--quiet", "--no-report"]) == 0
    assert "note: replacing" not in capsys.readouterr().err
    assert all((mine / f).read_text() == "mine" for f in ("requests.csv", "sweep.yaml"))
    # a sweep whose base scenario is a run's scenario.yaml in the folder it writes into: the
    # run's other files go, the file it read stays
    run = tmp_path / "run"
    assert main(["run", str(TINY), "--out", str(run), *n]) == 0
    (run / "grid.yaml").write_text("base: scenario.yaml\nset: {workload.num_requests: 10}\n"
                                   "grid:\n  workload.rate: [5]\n")
    assert main(["sweep", str(run / "grid.yaml"), "--out", str(run), "--workers", "1",
                 "--quiet", "--no-report"]) == 0
    assert (f"note: replacing the results of a run in {run}/ with a sweep's (removed "
            "summary.json, requests.csv, steps.csv)") in capsys.readouterr().err
    assert (run / "scenario.yaml").is_file()
    # a variant folder that links elsewhere, and one whose label is no folder name
    keep = tiny_run(tmp_path / "keep")
    cmp_dir = tmp_path / "cmp"
    cmp_dir.mkdir()
    (cmp_dir / "linked").symlink_to(keep)
    tiny_run(cmp_dir / "v_0")
    (cmp_dir / "comparison.csv").write_text(",TTFT p50 ms\nlinked,1\nv 0,2\n")
    assert main(["run", str(TINY), "--out", str(cmp_dir), *n]) == 0
    assert (f"note: replacing the results of a compare in {cmp_dir}/ with a run's (removed "
            "comparison.csv; 1 variant folder(s): v_0)") in capsys.readouterr().err
    assert not (cmp_dir / "v_0").exists() and (keep / "summary.json").is_file()
    # a comparison.csv the csv module refuses (a field past its limit) names no variant
    odd = tmp_path / "odd"
    tiny_run(odd / "a")
    (odd / "comparison.csv").write_text(',x\n"' + "a" * 200_000 + '",1\na,2\n')
    assert main(["run", str(TINY), "--out", str(odd), *n]) == 0
    assert (odd / "summary.json").is_file() and (odd / "a" / "summary.json").is_file()
    assert not (odd / "comparison.csv").exists()


def test_sweep_and_capacity_reports(tmp_path):
    grid = {"base": str(TINY), "set": {"workload.num_requests": 20},
            "grid": {"scheduler.policy": ["vllm_v0", "vllm_v1"],
                     "workload.rate": [5.0, 20.0, 80.0]}}
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(grid))
    spec = load_sweep(tmp_path / "g.yaml")
    save_sweep(sweep(spec, workers=1), spec, tmp_path / "sweep")
    assert len(check_self_contained(write_report([tmp_path / "sweep"]))) == 2

    s = simserve.load_scenario(TINY, overrides=["workload.num_requests=20"])
    capacity(s, seeds=1, tolerance=0.2, target_rate=60).save(tmp_path / "cap")
    sources = check_self_contained(write_report([tmp_path / "cap"]))
    assert len(sources) == 3            # attainment (with replicas panel), throughput, latency
    assert "Highest rate meeting" in (tmp_path / "cap" / "report.html").read_text()

    # everything at once, into a directory of its own
    tiny_run(tmp_path / "a")
    path = write_report([tmp_path / "sweep", tmp_path / "cap", tmp_path / "a"],
                        tmp_path / "all")
    assert len(check_self_contained(path)) == 2 + 3 + 2


def test_report_is_deterministic(tmp_path):
    run_dir = tiny_run(tmp_path / "run")
    first = write_report([run_dir]).read_bytes()
    assert write_report([run_dir]).read_bytes() == first


def test_several_runs_with_the_same_name_get_distinct_labels(tmp_path):
    tiny_run(tmp_path / "x" / "run")
    tiny_run(tmp_path / "y" / "run", **{"scheduler.policy": "sarathi"})
    inputs = load_inputs([tmp_path / "x" / "run", tmp_path / "y" / "run"])
    assert [r.label for r in inputs.runs] == ["x/run", "y/run"]
    with pytest.raises(SimserveError, match="--out"):
        write_report([tmp_path / "x" / "run", tmp_path / "y" / "run"])


def test_runs_whose_names_hold_dots_keep_a_figure_each(tmp_path, capsys):
    # the folders `simserve run --set scheduler.policy=...` makes: their figure names differ only
    # after the last dot, which a swapped suffix would cut off (one run's timeline overwriting
    # the other's)
    runs = [tiny_run(tmp_path / f"tiny+scheduler.policy={p}", **{"scheduler.policy": p})
            for p in ("sarathi", "fastserve")]
    out = tmp_path / "both"
    assert main(["report", *map(str, runs), "--out", str(out), "--svg"]) == 0
    names = sorted(p.name for p in (out / "figures").iterdir())
    timelines = [n for n in names if n.startswith("timeline_")]
    assert len(timelines) == 4, names        # a PNG and an SVG per run
    assert {n.rsplit(".", 1)[-1] for n in timelines} == {"png", "svg"}
    assert len(check_self_contained(out / "report.html")) == len(names) // 2


def test_not_a_run_directory(tmp_path):
    with pytest.raises(DataError, match="not a simserve output directory"):
        load_inputs([tmp_path])
    with pytest.raises(DataError, match="not a directory"):
        load_inputs([tmp_path / "missing"])
    # the same directory twice made two series of one run, under two labels
    (tmp_path / "x").mkdir()
    with pytest.raises(DataError, match=r"given twice \(also as .*x\): name each directory once"):
        load_inputs([tmp_path / "x", tmp_path / "." / "x"])


@pytest.mark.parametrize("file, cut, named", [
    # each was a KeyError traceback from a figure; now the file and what it lacks
    ("requests.csv", "ttft_s", "no column 'ttft_s'"),
    ("requests.csv", "status", "no column 'status'"),
    ("steps.csv", "replica", "no column 'replica'"),
    ("steps.csv", "kv_blocks_total", "no column 'kv_blocks_total'"),
])
def test_a_run_table_cut_short_is_named(tmp_path, capsys, file, cut, named):
    run = tiny_run(tmp_path / "r")
    table = pd.read_csv(run / file)
    table.drop(columns=[cut]).to_csv(run / file, index=False)
    code = main(["report", str(run), "--out", str(tmp_path / "rep")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: {run / file}: {named} (")
    assert err.count("\n") == 1


@pytest.mark.parametrize("kind, files, named", [
    ("capacity", {"capacity.json": "{}", "probes.csv": "rate\n1\n"},
     "capacity.json: no key 'target_attainment'"),
    ("plan", {"plan.json": '{"scenario": "x"}', "candidates.csv": "candidate\n0\n"},
     "plan.json: no key 'candidates'"),
])
def test_a_search_answer_cut_short_is_named(tmp_path, capsys, kind, files, named):
    (tmp_path / kind).mkdir()
    for name, text in files.items():
        (tmp_path / kind / name).write_text(text)
    code = main(["report", str(tmp_path / kind)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: {tmp_path / kind}/{named} (")


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory) -> Path:
    """A real `simserve plan` answer (8 H100 candidates of tests/data/plan_small.yaml)."""
    space = dict(yaml.safe_load((DATA / "plan_small.yaml").read_text())["plan"])
    space["hardware"] = ["H100-SXM"]
    return simserve.plan(DATA / "plan_small.yaml", 30, space=space, workers=1).save(
        tmp_path_factory.mktemp("plan") / "plan")


def _drop(path: list[str]):
    def edit(a: dict) -> None:
        node = a
        for k in path[:-1]:
            node = node[k]
        del node[path[-1]]
    return edit


def _set(path: list[str], value):
    def edit(a: dict) -> None:
        node = a
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    return edit


# each was a KeyError, TypeError, ValueError or AttributeError traceback from the plan section
@pytest.mark.parametrize("edit, named", [
    (_drop(["winner_row", "deployment"]), "no key 'winner_row.deployment'"),
    (_drop(["winner"]), "no key 'winner'"),
    (_set(["winner_row"], "x"), 'winner_row must be an object, got "x"'),
    (_set(["winner_row", "cost_per_hour"], "cheap"),
     'winner_row.cost_per_hour must be a number, got "cheap"'),
    (_set(["winner_row", "gpus"], None), "winner_row.gpus must be a number, got null"),
    (_set(["winner"], 99), "winner: candidate 99 is not a row of "),
    (_set(["runners_up"], 5), "runners_up must be a list, got 5"),
    (_set(["pareto"], [0, "a"]), 'pareto[1] must be an integer, got "a"'),
    (_set(["pareto"], [99]), "pareto[0]: candidate 99 is not a row of "),
    (lambda a: a.update(met=False, closest=[99]), "closest[0]: candidate 99 is not a row"),
    (_set(["target_rate"], "fast"), 'target_rate must be a number, got "fast"'),
    (_set(["slo"], [1]), "slo must be an object, got [1]"),
    (_set(["slo", "attainment"], "most"), 'slo.attainment must be a number, got "most"'),
    (_set(["pruned"], [1]), "pruned must be an object, got [1]"),
    (_set(["notes"], 5), "notes must be a list, got 5"),
    (_set(["vllm_serve"], [1]), "vllm_serve[0] must be a string, got 1"),
    (_set(["met"], "yes"), 'met must be true or false, got "yes"'),
])
def test_a_plan_answer_with_a_deep_gap_is_named(plan_dir, tmp_path, capsys, edit, named):
    import json
    import shutil
    d = shutil.copytree(plan_dir, tmp_path / "plan")
    answer = json.loads((d / "plan.json").read_text())
    edit(answer)
    (d / "plan.json").write_text(json.dumps(answer))
    code = main(["report", str(d), "--out", str(tmp_path / "rep")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: {d / 'plan.json'}: {named}"), err
    assert err.count("\n") == 1 and not (tmp_path / "rep").exists()


@pytest.mark.parametrize("edit, named", [
    (lambda t: t.drop(columns=["tokens_per_s_per_user"]), "no column 'tokens_per_s_per_user'"),
    (lambda t: t.drop(columns=["hardware"]), "no column 'hardware'"),
    (lambda t: t.assign(candidate=0), ":3: candidate 0 appears twice"),
])
def test_a_plan_table_with_a_deep_gap_is_named(plan_dir, tmp_path, capsys, edit, named):
    import shutil
    d = shutil.copytree(plan_dir, tmp_path / "plan")
    edit(pd.read_csv(d / "candidates.csv")).to_csv(d / "candidates.csv", index=False)
    code = main(["report", str(d), "--out", str(tmp_path / "rep")])
    err = capsys.readouterr().err
    where = f"error: {d / 'candidates.csv'}" + (named if named.startswith(":") else ": ")
    assert code == 2 and err.startswith(where) and named in err, err
    assert err.count("\n") == 1 and not (tmp_path / "rep").exists()


@pytest.fixture(scope="module")
def capacity_dir(tmp_path_factory) -> Path:
    s = simserve.load_scenario(TINY, overrides=["workload.num_requests=20"])
    return capacity(s, seeds=1, tolerance=0.2).save(tmp_path_factory.mktemp("cap") / "cap")


# as for plan.json: each was a KeyError, TypeError, ValueError or IndexError traceback
@pytest.mark.parametrize("edit, named", [
    (_drop(["tensor_parallel_size"]), "no key 'tensor_parallel_size'"),
    (_drop(["spread", "min"]), "no key 'spread.min'"),
    (_set(["seeds"], 3), "seeds must be a list, got 3"),
    (_set(["spread"], [1]), "spread must be an object, got [1]"),
    (_set(["max_rate"], None), "max_rate must be a number, got null"),
    (_set(["target_attainment"], "x"), 'target_attainment must be a number, got "x"'),
    (_set(["replicas"], "1"), 'replicas must be an integer, got "1"'),
    (_set(["slo"], [1]), "slo must be an object, got [1]"),
    (_set(["notes"], 3), "notes must be a list, got 3"),
    # a percentage where the figures take a fraction: the target line drawn at 9000 %
    (_set(["target_attainment"], 90), "target_attainment must be a fraction in (0, 1], got 90"),
])
def test_a_capacity_answer_with_a_deep_gap_is_named(capacity_dir, tmp_path, capsys, edit,
                                                      named):
    import json
    import shutil
    d = shutil.copytree(capacity_dir, tmp_path / "cap")
    answer = json.loads((d / "capacity.json").read_text())
    edit(answer)
    (d / "capacity.json").write_text(json.dumps(answer))
    code = main(["report", str(d), "--out", str(tmp_path / "rep")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: {d / 'capacity.json'}: {named}"), err
    assert err.count("\n") == 1 and not (tmp_path / "rep").exists()
    shutil.copy(capacity_dir / "capacity.json", d / "capacity.json")   # as written: reported
    assert main(["report", str(d), "--out", str(tmp_path / "rep")]) == 0


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("sweep")
    (d / "g.yaml").write_text(f"base: {TINY}\nset: {{workload.num_requests: 20}}\n"
                              "grid: {workload.rate: [5, 20]}\n")
    spec = load_sweep(d / "g.yaml")
    return save_sweep(sweep(spec, workers=1), spec, d / "sweep")


def _yaml_edit(edit):
    def apply(path: Path) -> None:
        spec = yaml.safe_load(path.read_text())
        edit(spec)
        path.write_text(yaml.safe_dump(spec))
    return apply


def _csv_edit(edit):
    def apply(path: Path) -> None:
        edit(pd.read_csv(path)).to_csv(path, index=False)
        path.with_suffix(".parquet").unlink(missing_ok=True)
    return apply


# each was an AttributeError, ValueError or KeyError traceback from the sweep or capacity section
@pytest.mark.parametrize("kind, file, edit, named", [
    ("sweep", "sweep.yaml", _yaml_edit(_set(["scenario"], [1])),
     "scenario must be an object, got [1]"),
    ("sweep", "sweep.yaml", _yaml_edit(_set(["scenario", "slo"], [1])),
     "scenario.slo must be an object, got [1]"),
    ("sweep", "sweep.yaml", _yaml_edit(_set(["scenario", "slo", "ttft_ms"], "x")),
     'scenario.slo.ttft_ms must be a number, got "x"'),
    ("sweep", "sweep.yaml", _yaml_edit(_set(["grid"], [1])), "grid must be an object, got [1]"),
    ("sweep", "sweep.csv", _csv_edit(lambda t: t.drop(columns=["policy"])),
     "no column 'policy'"),
    ("sweep", "sweep.csv", _csv_edit(lambda t: t.drop(columns=["request_throughput"])),
     "no column 'request_throughput'"),
    ("sweep", "sweep.csv", _csv_edit(lambda t: t.assign(request_throughput="x")),
     "column 'request_throughput' is not a number: 'x'"),
    ("sweep", "sweep.csv", _csv_edit(lambda t: t.assign(slo_attainment_target=90)),
     "slo_attainment_target must be a fraction in (0, 1], got 90"),
    ("capacity", "probes.csv", _csv_edit(lambda t: t.drop(columns=["request_throughput"])),
     "no column 'request_throughput'"),
    ("capacity", "probes.csv", _csv_edit(lambda t: t.assign(slo_attainment="most")),
     "column 'slo_attainment' is not a number: 'most'"),
])
def test_a_sweep_or_probe_table_with_a_deep_gap_is_named(sweep_dir, capacity_dir, tmp_path,
                                                         capsys, kind, file, edit, named):
    import shutil
    d = shutil.copytree(sweep_dir if kind == "sweep" else capacity_dir, tmp_path / kind)
    edit(d / file)
    code = main(["report", str(d), "--out", str(tmp_path / "rep")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: {d / file}") and named in err, err
    assert err.count("\n") == 1 and not (tmp_path / "rep").exists()


def test_a_sweep_whose_every_point_failed_is_still_reported(sweep_dir, tmp_path):
    # sweep_table writes no metric columns when no point ran: nothing to draw, nothing missing
    import shutil
    d = shutil.copytree(sweep_dir, tmp_path / "sweep")
    table = pd.read_csv(d / "sweep.csv")
    table = table[["point", "workload.rate", "policy", "offered_rate"]].assign(error="boom")
    table.to_csv(d / "sweep.csv", index=False)
    (d / "sweep.parquet").unlink(missing_ok=True)
    assert main(["report", str(d), "--out", str(tmp_path / "rep")]) == 0
    assert "Point 0 failed: boom" in (tmp_path / "rep" / "report.html").read_text()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return tiny_run(tmp_path_factory.mktemp("run") / "run", **{"workload.num_requests": 20})


def _json_edit(edit):
    def apply(path: Path) -> None:
        import json
        answer = json.loads(path.read_text())
        edit(answer)
        path.write_text(json.dumps(answer))
    return apply


# each was a TypeError, KeyError, ValueError or AttributeError traceback from the run sections
@pytest.mark.parametrize("file, edit, named", [
    ("summary.json", _json_edit(_set(["request_throughput"], "x")),
     'request_throughput must be a number, got "x"'),
    ("summary.json", _json_edit(_set(["p99_ttft_ms"], [1])), "p99_ttft_ms must be a number"),
    ("summary.json", _json_edit(_set(["latency_model"], [1])),
     "latency_model must be a string, got [1]"),
    ("summary.json", _json_edit(_set(["latency_trust"], {"curves": "x"})),
     "no key 'latency_trust.expected_error_pct'"),
    ("scenario.yaml", _yaml_edit(_set(["slo"], [1])), "slo must be an object, got [1]"),
    ("scenario.yaml", _yaml_edit(_set(["slo", "ttft_ms"], "x")),
     'slo.ttft_ms must be a number, got "x"'),
    ("scenario.yaml", _yaml_edit(_set(["scheduler"], [1])),
     "scheduler must be an object, got [1]"),
    ("scenario.yaml", _yaml_edit(_set(["scheduler", "policy"], [1])),
     "scheduler.policy must be a string, got [1]"),
])
def test_a_run_with_a_deep_gap_is_named(run_dir, tmp_path, capsys, file, edit, named):
    import shutil
    d = shutil.copytree(run_dir, tmp_path / "run")
    edit(d / file)
    # beside a sound run: the policy bars and the comparison table read every summary
    code = main(["report", str(d), str(run_dir), "--out", str(tmp_path / "rep")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: {d / file}: {named}"), err
    assert err.count("\n") == 1 and not (tmp_path / "rep").exists()


@pytest.mark.parametrize("content, named", [
    (b"", "not a readable CSV table (No columns to parse from file)"),
    (b"\xff\xfe,x\n", "not a readable CSV table (not UTF-8 text)"),
])
def test_a_compare_folder_with_an_unreadable_comparison_csv_is_named(run_dir, tmp_path, capsys,
                                                                     content, named):
    # it was read with pandas directly: an EmptyDataError or UnicodeDecodeError traceback
    import shutil
    for name in ("a", "b"):
        shutil.copytree(run_dir, tmp_path / "cmp" / name)
    (tmp_path / "cmp" / "comparison.csv").write_bytes(content)
    code = main(["report", str(tmp_path / "cmp"), "--out", str(tmp_path / "rep")])
    err = capsys.readouterr().err
    assert code == 2 and err == f"error: {tmp_path / 'cmp' / 'comparison.csv'}: {named}\n"
    assert not (tmp_path / "rep").exists()


def test_every_summary_number_the_report_reads_is_checked():
    from simserve.report.build import HEADLINE
    from simserve.report.figures import BARS
    from simserve.report.load import SUMMARY_NUMBERS
    assert set(HEADLINE) | {key for key, *_ in BARS} <= set(SUMMARY_NUMBERS)


def test_a_plan_answer_as_written_is_reported(plan_dir, tmp_path):
    import shutil
    d = shutil.copytree(plan_dir, tmp_path / "plan")
    assert main(["report", str(d), "--out", str(tmp_path / "rep")]) == 0
    assert "Cheapest: H100-SXM" in (tmp_path / "rep" / "report.html").read_text()


def test_capacity_probes_cut_short_are_named(tmp_path, capsys):
    s = simserve.load_scenario(TINY, overrides=["workload.num_requests=20"])
    capacity(s, seeds=1, tolerance=0.2).save(tmp_path / "cap")
    probes = pd.read_csv(tmp_path / "cap" / "probes.csv")
    probes.drop(columns=["phase"]).to_csv(tmp_path / "cap" / "probes.csv", index=False)
    with pytest.raises(DataError, match=r"probes\.csv: no column 'phase'"):
        load_inputs([tmp_path / "cap"])


def test_cli_report_and_opt_out(tmp_path, capsys):
    assert main(["run", str(TINY), "--out", str(tmp_path / "r"), "--quiet", "--no-report"]) == 0
    assert not (tmp_path / "r" / "report.html").exists()
    code = main(["report", str(tmp_path / "r"), "--out", str(tmp_path / "rep"),
                 "--title", "my runs"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "<title>my runs</title>" in (tmp_path / "rep" / "report.html").read_text()
    code = main(["report", str(tmp_path / "nothing")])
    out, err = capsys.readouterr()
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1


# --- pieces ------------------------------------------------------------------------------------

def test_one_fixed_colour_per_policy():
    assert policy_color("vllm_v1") == POLICY_COLORS["vllm_v1"]
    styles = series_styles([("a", "sarathi"), ("b", "sarathi"), ("c", "vllm_v0")])
    assert styles["a"]["color"] == styles["b"]["color"] == POLICY_COLORS["sarathi"]
    assert styles["a"]["linestyle"] != styles["b"]["linestyle"]
    assert styles["a"]["hatch"] != styles["b"]["hatch"]


def test_every_policy_has_its_own_colour_and_new_names_take_spares_in_order():
    from simserve.report.style import SLO_COLOR
    from simserve.sched import POLICIES
    every = series_styles([(name, name) for name in POLICIES])
    colours = [st["color"] for st in every.values()]
    assert len(set(colours)) == len(POLICIES) and SLO_COLOR not in colours
    # names we do not ship: distinct spares, in order of appearance, none a policy's colour
    new = series_styles([("x", "plugin_a"), ("y", "plugin_b"), ("z", "plugin_a")])
    assert new["x"]["color"] == new["z"]["color"] != new["y"]["color"]
    assert not {new["x"]["color"], new["y"]["color"]} & set(POLICY_COLORS.values())


def test_coinciding_series_are_drawn_apart_and_named():
    from simserve.report.style import legend_label, mark_coinciding
    styles = mark_coinciding(series_styles([("v1", "vllm_v1"), ("sarathi", "sarathi"),
                                            ("v0", "vllm_v0")]),
                             {"v1": 1, "sarathi": 1, "v0": 2})
    assert styles["sarathi"]["same_as"] == "v1" and styles["v0"]["same_as"] is None
    assert styles["sarathi"]["linestyle"] != styles["v1"]["linestyle"]
    assert styles["sarathi"]["marker"] != styles["v1"]["marker"]
    assert styles["sarathi"]["markerfacecolor"] == "none"
    assert legend_label("sarathi", styles["sarathi"]) == "sarathi (= v1)"


def test_binned_levels_are_exact_time_averages():
    # replica 0: value 2 during [0, 1], idle [1, 2], value 4 during [2, 3]
    # replica 1: value 1 during [0.5, 3.5]
    steps = pd.DataFrame({"replica": [0, 0, 1], "start_s": [0.0, 2.0, 0.5],
                          "duration_s": [1.0, 1.0, 3.0], "v": [2.0, 4.0, 1.0]})
    got = _binned(steps, "v", np.array([0.0, 2.0, 4.0]))
    # bin [0, 2]: (2·1 + 1·1.5) / 2 = 1.75;  bin [2, 4]: (4·1 + 1·1.5) / 2 = 2.75
    np.testing.assert_allclose(got, [1.75, 2.75])


def test_knee_is_the_last_load_before_the_first_miss():
    points = pd.DataFrame({"attainment_min": [1.0, 0.95, 0.85, 0.92]}, index=[2, 4, 6, 8])
    assert Curve("x", "vllm_v1", points).knee(0.9) == 4
    assert Curve("x", "vllm_v1", points).knee(None) is None
    assert Curve("x", "vllm_v1", points).knee(0.99) == 2


def test_knees_of_several_series_say_whose_they_are():
    from simserve.report.figures import throughput_vs_load
    def points(x):
        att = [1.0, 0.95, 0.5]
        return pd.DataFrame({"request_throughput": [2.0, 4.0, 5.0], "request_goodput": x,
                             "slo_attainment": att, "attainment_min": att,
                             "attainment_max": att}, index=x)
    curves = [Curve("L40S", "vllm_v1", points([2, 4, 8])),
              Curve("H200", "vllm_v1", points([4, 16, 32]))]
    fig = throughput_vs_load(curves, target=0.9)
    # the legend says whose knee each is; beside its line, the value alone (the series'
    # labels written there ran into each other and into the legend)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "L40S (knee 4)" in legend and "H200 (knee 16)" in legend
    assert sorted(t.get_text() for t in fig.axes[0].texts) == ["knee 16", "knee 4"]
    one = throughput_vs_load(curves[:1], target=0.9)
    assert [t.get_text() for t in one.axes[0].texts] == ["knee 4"]
    assert [t.get_text() for t in one.legends[0].get_texts()][0] == "L40S"
    # two series with one knee: one line, grey, labelled once
    same = [curves[0], Curve("A100", "vllm_v0", points([2, 4, 8]))]
    fig = throughput_vs_load(same, target=0.9)
    assert [t.get_text() for t in fig.axes[0].texts] == ["knee 4"]
    assert fig.axes[0].texts[0].get_color() == SHARED_KNEE_COLOR


def test_figures_from_in_memory_results():
    from simserve.report import latency_cdfs, policy_bars, timeline
    results = {p: simserve.run(TINY, overrides=[f"scheduler.policy={p}",
                                                "workload.num_requests=20"])
               for p in ("vllm_v1", "orca")}
    runs = [RunData.from_result(label, r) for label, r in results.items()]
    assert len(latency_cdfs(runs).axes) == 3
    assert len(policy_bars(runs).axes) == 6
    assert len(timeline(runs[0]).axes) == 4


def test_one_directory_alone_is_reported_and_several_need_out(tmp_path):
    # a str was read as its characters ("several directories given") and a Path was a
    # TypeError (no len())
    run_dir = tiny_run(tmp_path / "run")
    assert write_report(str(run_dir)) == run_dir / "report.html"
    assert write_report(run_dir) == run_dir / "report.html"
    # the Python caller is told of out=, the CLI's of --out (the same argument)
    with pytest.raises(SimserveError, match=r"several directories given; say where the report "
                                            r"goes with out=DIR \(on the command line, --out"):
        write_report([run_dir, tmp_path / "other"])
    with pytest.raises(SimserveError, match=r"^report: paths\[1\]: expected a directory \(a str "
                                            r"or Path\), got int$"):
        write_report([run_dir, 5], tmp_path / "rep")
    with pytest.raises(SimserveError, match="^report: out: expected a directory .*got int$"):
        write_report(run_dir, out=5)


@pytest.fixture(scope="module")
def bare_result():
    return simserve.run(TINY, overrides=["workload.num_requests=20"])


@pytest.mark.parametrize("call, named", [
    (lambda F, r: F.latency_cdfs([r]), "latency_cdfs: runs[0]: expected RunData "
                                        "(RunData.from_result(label, result)), got Result"),
    (lambda F, r: F.latency_cdfs({"a": r}), "latency_cdfs: runs: expected a list of RunData "
                                            "(RunData.from_result(label, result)), got dict; "
                                            "for results by label: [RunData.from_result(label, "
                                            "r) for label, r in results.items()]"),
    (lambda F, r: F.policy_bars([r, r]), "policy_bars: runs[0]: expected RunData"),
    (lambda F, r: F.timeline(r), "timeline: run: expected RunData "
                                 "(RunData.from_result(label, result)), got Result"),
    (lambda F, r: F.capacity_attainment(r), "capacity_attainment: cap: expected CapacityData "
                                            "(CapacityData.from_result(result)), got Result"),
    (lambda F, r: F.plan_pareto(r), "plan_pareto: plan: expected PlanData "
                                    "(PlanData.from_result(result)), got Result"),
    (lambda F, r: F.throughput_vs_load(r.requests), "throughput_vs_load: curves: expected a "
                                                    "list of Curve (load_curves(table, x, "
                                                    "series)), got DataFrame"),
    (lambda F, r: F.latency_vs_load([r]), "latency_vs_load: curves[0]: expected Curve"),
    (lambda F, r: F.CapacityData.from_result(r), "CapacityData.from_result: expected a "
                                                 "simserve CapacityResult (what "
                                                 "simserve.capacity returns), got Result"),
    (lambda F, r: F.PlanData.from_result(r), "PlanData.from_result: expected a simserve "
                                             "PlanResult (what simserve.plan returns), got "
                                             "Result"),
    (lambda F, r: F.RunData.from_result("x", {"a": 1}), "RunData.from_result: expected a "
                                                        "simserve Result (what simserve.run "
                                                        "returns), got dict"),
    (lambda F, r: F.RunData.from_result(r, "x"), "RunData.from_result: label: expected a str, "
                                                 "got Result"),
])
def test_figures_given_a_bare_result_say_what_they_take(bare_result, call, named):
    # each was an AttributeError ('Result' object has no attribute 'label', 'to_dict', ...)
    from simserve.report import figures
    with pytest.raises(SimserveError) as e:
        call(figures, bare_result)
    assert str(e.value).startswith(named), str(e.value)


def test_figures_take_one_run_or_curve_alone_and_a_timeline_needs_steps():
    run = _synthetic_run("a", "vllm_v1")
    from simserve.report.figures import latency_cdfs, policy_bars, timeline
    assert len(latency_cdfs(run).axes) == 3 and len(policy_bars(run).axes) == 6
    # (its steps were None: an AttributeError from sort_values)
    with pytest.raises(SimserveError, match="^timeline: run: a has no per-step table"):
        timeline(run)


def _sweep_table(**extra) -> pd.DataFrame:
    """A sweep.csv as simserve.sweep writes one: varied fields between point and policy."""
    return pd.DataFrame({"point": [0, 1, 2, 3], "workload.rate": [5, 10, 5, 10],
                         "engine.max_num_seqs": [8, 8, 16, 16], "policy": "vllm_v1",
                         "error": None, "request_throughput": [4.9, 9.0, 5.0, 9.8],
                         "slo_attainment": [1.0, 0.8, 1.0, 0.95], **extra})


def test_load_curves_name_a_missing_column_and_take_one_series_column_alone():
    from simserve.report.figures import load_curves
    t = _sweep_table()
    # one name is that column (its characters were a KeyError 's'), as in a list of one
    one = load_curves(t, "workload.rate", "engine.max_num_seqs")
    assert [c.label for c in one] == ["8", "16"]
    assert [c.label for c in load_curves(t, "workload.rate", ["engine.max_num_seqs"])] == \
        ["8", "16"]
    varied = ("the sweep varied workload.rate, engine.max_num_seqs; each point's scheduler "
              "policy is column 'policy'")
    with pytest.raises(SimserveError) as e:         # a KeyError
        load_curves(t, "workload.rat", [])
    assert str(e.value) == f"load_curves: x: no column 'workload.rat' in the table; {varied}"
    with pytest.raises(SimserveError) as e:         # a field the sweep did not vary: a KeyError
        load_curves(t, "workload.rate", "scheduler.policy")
    assert str(e.value) == ("load_curves: series: no column 'scheduler.policy' in the table; "
                            f"{varied}")
    with pytest.raises(SimserveError, match=r"^load_curves: series\[1\]: no column 'seed' .*"
                                            "its columns: a, policy$"):
        load_curves(pd.DataFrame({"a": [1], "policy": ["x"]}), "a", ["a", "seed"])
    with pytest.raises(SimserveError, match="^load_curves: table: no rows"):   # an IndexError
        load_curves(t.iloc[:0], "workload.rate")
    with pytest.raises(SimserveError, match="^load_curves: table: no point to draw: every row "
                                            "failed"):
        load_curves(t.assign(error="boom"), "workload.rate")
    with pytest.raises(SimserveError, match="^load_curves: table: expected a DataFrame"):
        load_curves(t.to_dict(), "workload.rate")


def test_an_attainment_target_is_a_fraction():
    # 90 (the tables' percentage) drew the target line at 9000 % and found no knee, silently
    from simserve.errors import ConfigError
    from simserve.report.figures import load_curves, throughput_vs_load
    curves = load_curves(_sweep_table(), "workload.rate", ["engine.max_num_seqs"])
    assert curves[1].knee(0.9) == 10 and curves[0].knee(0.9) == 5
    for bad in (90, 0, -0.5, "0.9", True):
        with pytest.raises(ConfigError, match=r"^target: must be .*a fraction in \(0, 1\]"):
            throughput_vs_load(curves, target=bad)
        with pytest.raises(ConfigError, match=r"^target: must be .*a fraction in \(0, 1\]"):
            curves[0].knee(bad)
    with pytest.raises(ConfigError, match=r"\(0.9 for 90 %\), got 90$"):
        throughput_vs_load(curves, target=90)
    assert len(throughput_vs_load(curves, target=1).axes) == 2


def test_styled_shows_a_series_as_a_one_column_table_and_refuses_other_things(bare_result):
    # a Series was an AttributeError ('columns'), a Result one from inside fmt.py
    from simserve.fmt import format_table, styled
    s = pd.Series([0.9997, 0.5], name="SLO attainment")
    assert "SLO attainment (%)" in styled(s).to_html()
    assert format_table(s).split()[:3] == ["SLO", "attainment", "(%)"]
    with pytest.raises(SimserveError, match="^styled: expected a pandas DataFrame or Series, "
                                            "got Result$"):
        styled(bare_result)
    with pytest.raises(SimserveError, match="^format_table: expected .*got dict$"):
        format_table({"a": [1]})


# --- legibility (issue #33 item 5) -------------------------------------------------------------

def _synthetic_run(label: str, policy: str, scale: float = 1.0, seed: int = 0) -> RunData:
    rng = np.random.default_rng(seed)
    n = 400
    ttft = rng.lognormal(np.log(0.06), 0.8, n) * scale        # ~15 ms .. ~600 ms
    tpot = rng.lognormal(np.log(0.025), 0.3, n) * scale       # ~15 ms .. ~60 ms
    e2el = rng.lognormal(np.log(3.0), 0.9, n) * scale         # ~300 ms .. ~30 s
    requests = pd.DataFrame({"status": "finished", "ttft_s": ttft, "tpot_s": tpot,
                             "e2el_s": e2el})
    summary = {"request_throughput": 9.1 * scale, "request_goodput": 9.0, "slo_attainment": 0.99,
               "p99_ttft_ms": 465.0 * scale, "p99_tpot_ms": 45.6, "total_preemptions": 90,
               "num_rejected": 0}
    return RunData(label, policy, requests, None, summary,
                   {"slo": {"ttft_ms": 500, "tpot_ms": 50}})


def _texts_overlap(fig, texts) -> list[tuple[str, str]]:
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts
             if t.get_visible() and t.get_text()]
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:]
            if ba.overlaps(bb)]


def test_the_overlap_check_sees_labels_that_overlap():
    # the checks below would pass vacuously if _texts_overlap missed overlapping text
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    try:
        texts = [ax.text(0.5, 0.5, "first label"), ax.text(0.52, 0.5, "second label"),
                 ax.text(0.1, 0.1, "apart"), ax.text(0.5, 0.9, "")]
        fig.canvas.draw()
        assert _texts_overlap(fig, texts) == [("first label", "second label")]
    finally:
        plt.close(fig)


def test_log_axis_tick_labels_do_not_overlap():
    from simserve.report import latency_cdfs
    fig = latency_cdfs([_synthetic_run("quickstart", "vllm_v1")])
    fig.canvas.draw()
    for ax in fig.axes[:3]:
        labels = [t for t in ax.get_xticklabels() if t.get_text()]
        assert len(labels) >= 2, [t.get_text() for t in labels]
        assert _texts_overlap(fig, labels) == []
        assert not any("times" in t.get_text() or "^" in t.get_text() for t in labels)


def test_a_curve_under_another_is_named_and_drawn_apart():
    from simserve.report import latency_cdfs
    runs = [_synthetic_run("orca", "orca"), _synthetic_run("vllm_v0", "vllm_v0", 1.3, 1),
            _synthetic_run("vllm_v1", "vllm_v1", 1.01)]       # 1 % off orca: hidden beneath
    fig = latency_cdfs(runs)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "vllm_v1 (≈ orca)" in legend and "vllm_v0" in legend
    lines = {line.get_color(): line for line in fig.axes[0].get_lines() if line.get_marker()}
    v1 = lines[POLICY_COLORS["vllm_v1"]]
    assert v1.get_linestyle() != "-" and v1.get_markerfacecolor() == "none"


def test_a_curve_under_another_in_one_panel_only_is_named_in_that_panel():
    # orca's TPOT within 1 % of vllm_v1's but its TTFT 30 % off: the legend (which needs all
    # three close) said nothing and the TPOT panel drew one line over the other
    from simserve.report import latency_cdfs
    v1, orca = _synthetic_run("vllm_v1", "vllm_v1"), _synthetic_run("orca", "orca", seed=1)
    orca.requests["tpot_s"] = v1.requests["tpot_s"] * 1.01
    fig = latency_cdfs([v1, orca])
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "orca" in legend and not any("≈" in t for t in legend)
    notes = [[t.get_text() for t in ax.texts] for ax in fig.axes[:3]]
    assert notes == [[], ["here orca ≈ vllm_v1"], []], notes
    # already said in the legend: not said again in a panel
    fig = latency_cdfs([v1, _synthetic_run("orca", "orca", 1.01)])
    assert [t.get_text() for ax in fig.axes[:3] for t in ax.texts] == []


def _delta_e(a: str, b: str) -> float:
    """CIE76 colour difference of two sRGB hex colours."""
    def lab(h: str) -> np.ndarray:
        rgb = np.array([int(h[i:i + 2], 16) / 255 for i in (1, 3, 5)])
        rgb = np.where(rgb > 0.04045, ((rgb + 0.055) / 1.055) ** 2.4, rgb / 12.92)
        xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722],
                        [0.0193, 0.1192, 0.9505]]) @ rgb / np.array([0.95047, 1.0, 1.08883])
        f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
        return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])
    return float(np.linalg.norm(lab(a) - lab(b)))


def test_every_policy_colour_and_marker_tells_apart():
    from simserve.report.style import SLO_COLOR
    from simserve.sched import POLICIES
    every = series_styles([(name, name) for name in POLICIES])
    colours = {name: st["color"] for name, st in every.items()} | {"SLO": SLO_COLOR}
    close = [(a, b, round(_delta_e(ca, cb), 1)) for i, (a, ca) in enumerate(colours.items())
             for b, cb in list(colours.items())[i + 1:] if _delta_e(ca, cb) < 25]
    assert close == []          # tgi's brown and priority's maroon were 12.2 apart
    markers = [st["marker"] for st in every.values()]
    assert len(set(markers)) == len(markers)


def test_ten_policies_bar_labels_do_not_overlap():
    from simserve.report import policy_bars
    names = ["vllm_v1", "vllm_v1-prefix", "sarathi-512-prefix", "priority", "tgi", "lmdeploy",
             "fastserve", "s3", "trtllm-no-evict", "trtllm-max-util"]
    runs = [_synthetic_run(n, n.split("-")[0], 1 + i / 10, i) for i, n in enumerate(names)]
    fig = policy_bars(runs)
    fig.canvas.draw()
    for ax in fig.axes:
        assert _texts_overlap(fig, ax.get_xticklabels()) == []
        assert _texts_overlap(fig, [t for t in ax.texts]) == []


def test_fractions_are_shown_as_percentages_wherever_a_table_shows_them():
    from simserve.fmt import attainment_percent
    df = pd.DataFrame({"SLO attainment": [0.95], "mean KV use": [0.0986],
                       "prefix cache hit rate": [0.5], "meets target": ["yes"],
                       "TTFT p50 ms": [12.0]})
    out = attainment_percent(df)
    assert list(out.columns) == ["SLO attainment (%)", "mean KV use (%)",
                                 "prefix cache hit rate (%)", "meets target", "TTFT p50 ms"]
    assert out.iloc[0].tolist() == [95.0, pytest.approx(9.86), 50.0, "yes", 12.0]


def test_a_number_rounded_up_to_the_next_size_is_shown_as_that_size_is():
    # a capacity table showed attainment 100 for 1.0 and "100.0" for 0.9997 in one column
    from simserve.fmt import format_table, human
    assert [human(x) for x in (100.0, 99.97, 99.94, 9.996, 9.99, 12.34, -99.97)] == [
        "100", "100", "99.9", "10.0", "9.99", "12.3", "-100"]
    table = format_table(pd.DataFrame({"max attainment": [1.0, 0.9997]}))
    assert table.split() == ["max", "attainment", "(%)", "0", "100", "1", "100"]


def test_styled_tables_render_with_jinja2_and_fall_back_to_text_without(monkeypatch):
    # a bare kernel (ipykernel alone) has no jinja2: pandas' Styler failed there with an
    # AttributeError, in make_notebooks.py and in a user's notebook alike
    import sys
    from simserve.fmt import styled
    df = pd.DataFrame({"SLO attainment": [0.9997], "tok/s": [11150.0]})
    html = styled(df).to_html()
    assert "11,150" in html and "100" in html and "SLO attainment (%)" in html
    monkeypatch.setitem(sys.modules, "jinja2", None)      # (import jinja2: ImportError)
    plain = styled(df)
    assert isinstance(plain, pd.DataFrame)
    assert plain.to_dict("list") == {"SLO attainment (%)": ["100"], "tok/s": ["11,150"]}


def test_the_report_says_each_runs_trust_beside_its_name():
    # the runs' trust lines were pooled into one set (two near-identical bands, "this run is
    # synchronous" without saying which) and a run with no measured error said nothing
    import simserve
    from simserve.report.build import _provenance
    from simserve.report.load import Inputs
    quick = Path(__file__).parents[2] / "scenarios" / "quickstart.yaml"
    small = ["workload.num_requests=20"]
    h100 = simserve.run(quick, overrides=small)
    l40s = simserve.run(quick, overrides=[*small, "hardware=L40S"])
    text = _provenance(Inputs(runs=[RunData.from_result("h100", h100),
                                    RunData.from_result("l40s", l40s)]))
    assert "h100: Expected error of the h100-vllm step-time model" in text
    assert "l40s: No measured error for this step-time model" in text
    one = _provenance(Inputs(runs=[RunData.from_result("h100", h100)]))
    assert "h100:" not in one and "Expected error of the h100-vllm" in one


def test_a_run_whose_steps_were_folded_still_gives_its_request_figures(monkeypatch):
    """A replica past FOLD_STEPS keeps no per-step table: RunData takes the run without it
    (the latency CDFs need only requests), and the timeline says it needs steps."""
    from simserve.metrics import levels, recorder
    from simserve.report import latency_cdfs, timeline
    monkeypatch.setattr(levels, "LEVEL_CHUNK", 32)       # (as tests/integration/test_long_runs)
    monkeypatch.setattr(recorder, "FOLD_STEPS", 64)
    result = simserve.run(TINY, overrides=["workload.num_requests=600"])
    assert not result.has_steps
    data = RunData.from_result("folded", result)
    assert data.steps is None and len(data.requests) == 600
    assert latency_cdfs([data]) is not None
    with pytest.raises(SimserveError, match="step"):
        timeline(data)
