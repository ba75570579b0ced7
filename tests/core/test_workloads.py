"""Workloads for the simulator: paper job sets 4-9, Poisson arrivals, CSV traces, store traces."""

from __future__ import annotations

import json
import sqlite3
import statistics
from collections import Counter

import pytest
from click.testing import CliRunner

from marbled.cli.client_cmd import main as marble
from marbled.core.policy import get_policy
from marbled.core.spec import NODES_HELP, JobSpec
from marbled.resources import load_job_file, load_profile, workload_path
from marbled.sim.engine import Simulator
from marbled.sim.workloads import (
    Arrival,
    StoreTrace,
    TraceError,
    from_job_file,
    poisson,
    read_trace,
    trace_from_store,
    write_trace,
)
from marbled.store.db import Store
from marbled.store.orm import JobRow
from tests.core.test_simulator import MULTI_NODE_JOBS, TWO_BY_TWO

# ---------------------------------------------------------------- paper job sets

# Tables III (job sets 4-6) and IV (job sets 7-9) of Han et al., MARBLE (CCGrid 2020).
R50, INC, R101, VGG = "resnet-50", "inception-v3", "resnet-101", "vgg-16"
EPOCH = 39936
PAPER = {
    4: [(R50, 9000), (INC, 1200), (INC, 4200), (R50, 6000), (R101, 2000)],
    5: [(INC, 4800), (INC, 9000), (VGG, 9600), (R50, 3000), (INC, 3000)],
    6: [(R50, 8400), (VGG, 4800), (INC, 9300), (R50, 2000), (R101, 3000)],
    7: [(R101, EPOCH), (INC, EPOCH), (INC, EPOCH), (VGG, EPOCH)],
    8: [(INC, EPOCH), (R50, EPOCH), (VGG, EPOCH), (R50, EPOCH)],
    9: [(INC, EPOCH), (R50, EPOCH), (R50, EPOCH), (R101, EPOCH)],
}


def jobset(n: int):
    return workload_path(f"paper-jobset{n}")


@pytest.mark.parametrize("n", sorted(PAPER))
def test_paper_job_set_files_match_the_tables(n):
    specs = load_job_file(jobset(n))
    assert [(s.model, s.steps) for s in specs] == PAPER[n]
    assert all(s.emulate and s.gpus is None and not s.command for s in specs)
    header = jobset(n).read_text().splitlines()[0]
    assert f"Job set {n} " in header and ("Table III" if n <= 6 else "Table IV") in header


def test_paper_job_sets_spot_values():
    js4 = load_job_file(jobset(4))
    assert (js4[0].model, js4[0].steps) == ("resnet-50", 9000)
    assert (js4[4].model, js4[4].steps) == ("resnet-101", 2000)
    assert [(s.model, s.steps) for s in load_job_file(jobset(5))][2] == ("vgg-16", 9600)
    assert [(s.model, s.steps) for s in load_job_file(jobset(6))][2] == ("inception-v3", 9300)
    for n in (4, 5, 6):
        assert len(load_job_file(jobset(n))) == 5
    for n in (7, 8, 9):
        specs = load_job_file(jobset(n))
        assert len(specs) == 4 and {s.steps for s in specs} == {39936}
    assert [s.model for s in load_job_file(jobset(7))] == [R101, INC, INC, VGG]


def test_paper_models_have_curves_in_the_profile():
    from marbled.resources import load_profile

    book = load_profile("summit-v100")
    for n in PAPER:
        for s in load_job_file(jobset(n)):
            assert book.lookup(s.model) is not None, (n, s.model)


def test_from_job_file_puts_every_job_at_zero():
    arrivals = from_job_file(jobset(4))
    assert [a.at for a in arrivals] == [0.0] * 5
    assert [a.spec for a in arrivals] == load_job_file(jobset(4))
    assert from_job_file(str(jobset(1)))[1].spec.steps == 3600


# ---------------------------------------------------------------- Poisson

MIX = {R50: 0.5, INC: 0.3, VGG: 0.2}


def test_poisson_is_deterministic_for_a_seed_and_differs_across_seeds():
    a = poisson(50, 10, MIX, (100, 5000), seed=7, gpus_request_share=0.3)
    b = poisson(50, 10, MIX, (100, 5000), seed=7, gpus_request_share=0.3)
    c = poisson(50, 10, MIX, (100, 5000), seed=8, gpus_request_share=0.3)
    assert a == b
    assert a != c
    assert [x.at for x in a] != [x.at for x in c]


def test_poisson_jobs_are_valid_emulated_jobs_in_order():
    arrivals = poisson(300, 30, MIX, (100, 5000), seed=1)
    assert len(arrivals) == 300
    times = [a.at for a in arrivals]
    assert times == sorted(times) and times[0] > 0
    for a in arrivals:
        assert isinstance(a, Arrival)
        assert a.spec.emulate and a.spec.model in MIX and 100 <= a.spec.steps <= 5000
        assert a.spec.gpus is None
        assert JobSpec.from_mapping(a.spec.to_mapping()) == a.spec
    assert poisson(0, 30, MIX, (1, 2), seed=1) == []


def test_poisson_mean_gap_is_close_to_3600_over_rate():
    for rate in (4.0, 60.0):
        arrivals = poisson(2000, rate, MIX, (100, 200), seed=3)
        times = [0.0] + [a.at for a in arrivals]
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        assert statistics.fmean(gaps) == pytest.approx(3600 / rate, rel=0.10)
        assert min(gaps) >= 0


def test_poisson_mix_proportions():
    arrivals = poisson(4000, 60, MIX, (100, 200), seed=11)
    counts = Counter(a.spec.model for a in arrivals)
    for model, weight in MIX.items():
        assert counts[model] / 4000 == pytest.approx(weight, abs=0.03)
    # weights need not sum to 1; a zero weight never draws
    counts = Counter(a.spec.model for a in poisson(1000, 60, {R50: 3, INC: 1, VGG: 0},
                                                   (1, 2), seed=2))
    assert counts[VGG] == 0 and counts[R50] / 1000 == pytest.approx(0.75, abs=0.05)


def test_poisson_steps_per_model_and_uniform_spread():
    ranges = {R50: (100, 200), INC: (1000, 1000), VGG: (5000, 9000)}
    arrivals = poisson(2000, 60, MIX, ranges, seed=5)
    for a in arrivals:
        low, high = ranges[a.spec.model]
        assert low <= a.spec.steps <= high
    vgg = [a.spec.steps for a in arrivals if a.spec.model == VGG]
    assert statistics.fmean(vgg) == pytest.approx(7000, rel=0.05)  # uniform: the midpoint
    assert min(vgg) < 5400 and max(vgg) > 8600


def test_poisson_gpus_request_share():
    arrivals = poisson(3000, 60, MIX, (100, 200), seed=9, gpus_request_share=0.25)
    rigid = [a.spec.gpus for a in arrivals if a.spec.gpus is not None]
    assert len(rigid) / 3000 == pytest.approx(0.25, abs=0.03)
    assert set(rigid) == {1, 2, 3, 4, 5, 6}
    assert all(a.spec.gpus is not None for a in poisson(20, 60, MIX, (1, 2), 1, 1.0))
    # the share only decides which jobs are rigid; times, models and steps stay the same
    auto = poisson(3000, 60, MIX, (100, 200), seed=9)
    assert [(a.at, a.spec.model, a.spec.steps) for a in auto] == [
        (a.at, a.spec.model, a.spec.steps) for a in arrivals]
    assert {a.spec.gpus for a in poisson(200, 60, MIX, (1, 2), 4, 1.0, max_gpus=2)} == {1, 2}


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"n": -1}, "n"),
    ({"rate_per_hour": 0}, "rate_per_hour"),
    ({"mix": {}}, "mix"),
    ({"mix": {R50: -1}}, "mix"),
    ({"mix": {R50: 0}}, "mix"),
    ({"steps": (0, 10)}, "steps"),
    ({"steps": (10, 5)}, "steps"),
    ({"steps": {R50: (1, 2)}}, "steps"),
    ({"gpus_request_share": 1.5}, "gpus_request_share"),
])
def test_poisson_rejects_bad_parameters(kwargs, field):
    args = {"n": 10, "rate_per_hour": 10, "mix": MIX, "steps": (1, 10), "seed": 1, **kwargs}
    with pytest.raises(ValueError, match=f"^{field}"):
        poisson(**args)


# ---------------------------------------------------------------- CSV traces


def test_csv_round_trip(tmp_path):
    arrivals = poisson(200, 30, MIX, (100, 5000), seed=4, gpus_request_share=0.4)
    arrivals += [
        Arrival(arrivals[-1].at, JobSpec(emulate=True, model=R50, steps=7, name="last, \"one\"")),
        Arrival(arrivals[-1].at + 0.1, JobSpec(emulate=True, model=VGG, steps=1, gpus=2,
                                               name="rigid")),
    ]
    path = tmp_path / "trace.csv"
    write_trace(path, arrivals, comment="poisson seed 4\nsecond line")
    assert path.read_text().startswith("# poisson seed 4\n# second line\narrival,model,steps")
    assert read_trace(path) == arrivals
    assert read_trace(str(path)) == arrivals


def test_csv_example_of_the_docs(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text(
        "# three jobs\n"
        "arrival,model,steps,gpus,name\n"
        "0,resnet-50,9000,,\n"
        "\n"
        "12.5,inception-v3,1200,auto,inc-a\n"
        "30,vgg-16,4800,2,rigid-vgg\n"
    )
    assert read_trace(path) == [
        Arrival(0.0, JobSpec(emulate=True, model=R50, steps=9000)),
        Arrival(12.5, JobSpec(emulate=True, model=INC, steps=1200, name="inc-a")),
        Arrival(30.0, JobSpec(emulate=True, model=VGG, steps=4800, gpus=2, name="rigid-vgg")),
    ]


def test_csv_optional_columns_in_any_order(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("steps, model ,arrival\n100,resnet-50,0\n200,vgg-16,0\n")
    assert read_trace(path) == [Arrival(0, JobSpec(emulate=True, model=R50, steps=100)),
                                Arrival(0, JobSpec(emulate=True, model=VGG, steps=200))]
    (tmp_path / "h.csv").write_text("arrival,model,steps,gpus,name\n")
    assert read_trace(tmp_path / "h.csv") == []


def trace_error(tmp_path, text: str, name: str = "trace.csv") -> TraceError:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceError) as info:
        read_trace(path)
    return info.value


HEADER = "arrival,model,steps,gpus,name\n"
OK = "0,resnet-50,100,,\n"


@pytest.mark.parametrize(("rows", "line", "field", "words"), [
    (OK * 5 + "1,resnet-50,ten,,\n", 7, "steps", "must be a whole number from 1 to"),
    ("0,resnet-50,0,,\n", 2, "steps", "must be a whole number from 1 to"),
    ("0,resnet-50,1.5,,\n", 2, "steps", "must be a whole number"),
    ("0,resnet-50,,,\n", 2, "steps", "needs both 'model' and 'steps'"),
    ("0,,100,,\n", 2, "model", "needs both 'model' and 'steps'"),
    ("-1,resnet-50,100,,\n", 2, "arrival", "must be a number of seconds >= 0"),
    ("soon,resnet-50,100,,\n", 2, "arrival", "must be a number of seconds >= 0"),
    ("nan,resnet-50,100,,\n", 2, "arrival", "must be a number of seconds >= 0"),
    ("5,resnet-50,100,,\n" + "4,resnet-50,100,,\n", 3, "arrival", "non-decreasing"),
    ("0,resnet-50,100,0,\n", 2, "gpus", "'auto' or a whole number"),
    ("0,resnet-50,100,many,\n", 2, "gpus", "'auto' or a whole number"),
    ("0,resnet-50,100,,123\n", 2, "name", "must not be all digits"),
    ("0,resnet-50,100\n", 2, "row", "has 3 values but the header names 5"),
])
def test_bad_rows_name_file_line_and_field(tmp_path, rows, line, field, words):
    err = trace_error(tmp_path, HEADER + rows)
    assert str(err).startswith(f"{tmp_path / 'trace.csv'}:{line}: {field}: ")
    assert words in str(err)
    assert (err.line, err.field) == (line, field)


@pytest.mark.parametrize(("cell", "message"), [
    ("0", NODES_HELP), ("two", NODES_HELP), ("1.5", NODES_HELP), ("1-", NODES_HELP),
    ("10001", NODES_HELP),
    ("3-1", "the range 3-1 runs backwards; write the fewest nodes first: 1-3"),
])
def test_a_bad_nodes_cell_gets_the_job_file_message_and_its_line(tmp_path, cell, message):
    err = trace_error(tmp_path, "arrival,model,steps,gpus,name,nodes\n"
                      "0,resnet-50,100,,,2\n" f"1,resnet-50,100,2,,{cell}\n")
    assert str(err) == f"{tmp_path / 'trace.csv'}:3: nodes: {message}"
    assert (err.line, err.field) == (3, "nodes")


def test_nodes_column_counts_ranges_and_empty_cells(tmp_path):
    (tmp_path / "t.csv").write_text("nodes,arrival,model,steps\n 2 ,0,m,1\n1-3,0,m,1\n,1,m,1\n")
    assert [(a.spec.nodes_min, a.spec.nodes) for a in read_trace(tmp_path / "t.csv")] == [
        (None, 2), (1, 3), (None, 1)]


def test_bad_steps_message_is_the_api_message(tmp_path):
    err = trace_error(tmp_path, "# comment\n" + HEADER + OK * 4 + "9,resnet-50,-3,,\n")
    assert str(err) == (f"{tmp_path / 'trace.csv'}:7: steps: must be a whole number "
                        "from 1 to 1000000000000")


@pytest.mark.parametrize(("header", "field", "words"), [
    ("arrival,model,steps,gpus,queue\n", "queue", "unknown column; known columns are arrival"),
    ("arrival,model,gpus\n", "steps", "missing column"),
    ("arrival,model,steps,steps\n", "steps", "column named twice"),
])
def test_bad_header(tmp_path, header, field, words):
    err = trace_error(tmp_path, "# c\n\n" + header + OK)
    assert str(err).startswith(f"{tmp_path / 'trace.csv'}:3: {field}: ")
    assert words in str(err)


def test_unreadable_traces(tmp_path):
    assert "empty" in str(trace_error(tmp_path, "# only a comment\n"))
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path / "missing.csv")
    err = trace_error(tmp_path, HEADER + '0,resnet-50,100,,"open\n')
    assert ":2: not valid CSV" in str(err)


def test_write_trace_refuses_what_the_format_cannot_hold(tmp_path):
    path = tmp_path / "t.csv"
    with pytest.raises(ValueError, match="arrival 1: a trace holds emulated jobs"):
        write_trace(path, [Arrival(0, JobSpec(command=("true",), gpus=1))])
    with pytest.raises(ValueError, match="arrival 1: a trace cannot hold dependencies"):
        write_trace(path, [Arrival(0, JobSpec(emulate=True, model=R50, steps=1, after=(1,)))])
    with pytest.raises(ValueError, match="arrival 2: time"):
        write_trace(path, [Arrival(5, JobSpec(emulate=True, model=R50, steps=1)),
                           Arrival(4, JobSpec(emulate=True, model=R50, steps=1))])


# ---------------------------------------------------------------- traces from a store


def job(id: int, submitted_at: float, model: str | None = R50, steps: int | None = 100,
        gpus: int | None = None, name: str | None = None, state: str = "done",
        nodes: int = 1, nodes_min: int | None = None) -> JobRow:
    return JobRow(
        id=id, name=name, model=model, steps=steps, gpus_request=gpus,
        demand=gpus or 3, malleable=gpus is None, nodes=nodes, nodes_min=nodes_min,
        command=[] if model and steps else ["python", "x.py"],
        emulate=bool(model and steps), after=[], state=state, step=0, suspensions=0,
        submitted_at=submitted_at,
    )


def test_trace_from_store(tmp_path):
    db = tmp_path / "marble.db"
    store = Store(db)
    t0 = 1_700_000_000.0
    with store.tx() as s:
        s.add_all([
            job(1, t0 - 5, model=None, steps=None, gpus=2),  # a plain command: skipped
            job(2, t0, model=R50, steps=9000),
            job(3, t0 + 12.5, model=INC, steps=1200, name="inc-a", state="cancelled"),
            job(4, t0 + 12.5, model=VGG, steps=None, gpus=1),  # no steps: skipped
            job(6, t0 + 30.25, model=VGG, steps=4800, gpus=2, state="running"),
            job(5, t0 + 30, model=R101, steps=2000, state="queued"),
        ])
    try:
        result = trace_from_store(db)  # read-only, while the broker's engine is open
    finally:
        store.close()
    assert isinstance(result, StoreTrace)
    arrivals, skipped = result
    assert skipped == 2
    assert arrivals == [
        Arrival(0.0, JobSpec(emulate=True, model=R50, steps=9000)),
        Arrival(12.5, JobSpec(emulate=True, model=INC, steps=1200, name="inc-a")),
        Arrival(30.0, JobSpec(emulate=True, model=R101, steps=2000)),
        Arrival(30.25, JobSpec(emulate=True, model=VGG, steps=4800, gpus=2)),
    ]
    # and it writes as a trace that reads back the same, in the format of single-node traces
    write_trace(tmp_path / "t.csv", arrivals)
    assert read_trace(tmp_path / "t.csv") == arrivals
    assert (tmp_path / "t.csv").read_text().splitlines()[0] == "arrival,model,steps,gpus,name"


def test_a_store_trace_keeps_multi_node_jobs_for_simulate(tmp_path):
    """The store of a broker that ran the jobs of MULTI_NODE_JOBS (one on 2 nodes, one on
    1-2): `marble trace` then `marble simulate` replays them as the job file does."""
    store = Store(tmp_path / "marble.db")
    with store.tx() as s:
        s.add_all([job(1, 50.0, "m", 100, gpus=1, nodes=2),
                   job(2, 50.0, "m", 200, gpus=1, nodes=2, nodes_min=1),
                   job(3, 50.0, "m", 200, gpus=2)])
    store.close()
    csv = tmp_path / "t.csv"
    out = CliRunner().invoke(marble, ["trace", str(tmp_path / "marble.db"), "-o", str(csv)])
    assert out.exit_code == 0, out.output
    assert csv.read_text().splitlines()[1:] == [
        "arrival,model,steps,gpus,name,nodes", "0.0,m,100,1,,2", "0.0,m,200,1,,1-2",
        "0.0,m,200,2,,1"]
    (tmp_path / "p.yaml").write_text(TWO_BY_TWO)
    (tmp_path / "jobs.yaml").write_text(MULTI_NODE_JOBS)
    arrivals = read_trace(csv)
    assert [a.spec for a in arrivals] == [a.spec for a in from_job_file(tmp_path / "jobs.yaml")]
    r = Simulator(load_profile(tmp_path / "p.yaml"), get_policy("marble"), 2, 2).run(arrivals)
    assert {run.job: len(run.parts()) for run in r.runs} == {1: 2, 2: 2, 3: 1}
    out = CliRunner().invoke(marble, ["simulate", "--profile", str(tmp_path / "p.yaml"),
                                      "--workload", str(csv), "--nodes", "2", "--json"])
    assert out.exit_code == 0, out.output
    results = json.loads(out.output)["results"]
    assert {x["policy"] for x in results} == {"adaptive", "marble", "rigid", "whatif"}
    assert all(x["makespan_s"] == pytest.approx(300.0) for x in results)


def test_a_trace_from_an_older_store_without_node_ranges(tmp_path):
    store = Store(tmp_path / "marble.db")
    with store.tx() as s:
        s.add(job(1, 100.0, nodes=3))
    store.close()
    with sqlite3.connect(tmp_path / "marble.db") as con:  # as a broker of schema 7 left it
        con.execute("ALTER TABLE jobs DROP COLUMN nodes_min")
    (arrival,), _ = trace_from_store(tmp_path / "marble.db")
    assert (arrival.spec.nodes_min, arrival.spec.nodes) == (None, 3)


def test_trace_from_store_does_not_write(tmp_path):
    db = tmp_path / "marble.db"
    store = Store(db)
    with store.tx() as s:
        s.add(job(1, 100.0))
    store.close()
    before = db.read_bytes()
    assert trace_from_store(str(db)) == StoreTrace([Arrival(0.0, JobSpec(
        emulate=True, model=R50, steps=100))], 0)
    assert db.read_bytes() == before


def test_trace_from_an_empty_or_wrong_file(tmp_path):
    Store(tmp_path / "marble.db").close()
    assert trace_from_store(tmp_path / "marble.db") == ([], 0)
    with pytest.raises(TraceError, match="no such file"):
        trace_from_store(tmp_path / "nope.db")
    (tmp_path / "other.db").write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(TraceError, match="not a marbled store"):
        trace_from_store(tmp_path / "other.db")
