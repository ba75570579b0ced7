"""Profile and trace files as users write them: every number form, and every error naming the
file, the line, the field and what would be accepted."""

from __future__ import annotations

import pytest

from marbled.core.policy import get_policy
from marbled.core.profiles import ProfileError
from marbled.core.spec import JobSpec, SpecError, size_job
from marbled.resources import load_profile
from marbled.sim.engine import Simulator
from marbled.sim.workloads import read_trace

HEAD = "system: t\ngpus_per_node: 4\nmodels:\n"


def profile(tmp_path, body: str, name: str = "p.yaml"):
    path = tmp_path / name
    path.write_text(HEAD + body)
    return path


def refused(path) -> str:
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    return str(err.value)


def test_numbers_in_every_form_yaml_and_python_write(tmp_path):
    path = profile(tmp_path, "  m:\n    steps_per_second: [1e3, 1.0e3, 2000, 5e-05]\n"
                             "    startup_s: 2.5e1\n")
    curve = load_profile(str(path)).lookup("m")
    assert curve.steps_per_second == (1000.0, 1000.0, 2000.0, 0.00005)
    assert curve.startup_s == 25.0


@pytest.mark.parametrize(("value", "says"), [
    (".inf", "must be a finite number, not inf"),
    (".nan", "must be a finite number, not nan"),
    ("true", "must be a positive number, not true"),
    ("'3'", "not the text '3' (write it unquoted)"),
    ("-2", "must be a positive number, not -2"),
])
def test_bad_numbers_are_refused_with_the_entry_and_its_line(tmp_path, value, says):
    path = profile(tmp_path, f"  m:\n    steps_per_second:\n      - 1.0\n      - {value}\n")
    message = refused(path)
    assert message.startswith(f"{path}:7: models.m.steps_per_second.1: ")
    assert says in message


def test_a_curve_longer_than_the_node_is_refused(tmp_path):
    path = profile(tmp_path, "  m:\n    steps_per_second: [1, 2, 3, 4, 5, 6]\n")
    message = refused(path)
    assert message.startswith(f"{path}:5: models.m.steps_per_second: ")
    assert "has 6 values but a node has 4 GPUs (gpus_per_node); give at most 4" in message


def test_null_marks_a_count_the_model_cannot_run_on(tmp_path):
    path = profile(tmp_path, "  big:\n    steps_per_second: [null, 1.8, 2.5, 3.0]\n"
                             "  never:\n    steps_per_second: [1.0]\n")
    book = load_profile(str(path))
    big = book.lookup("big")
    assert (big.possible(1), big.possible(2), big.optimal_gpus()) == (False, True, 4)
    assert big.largest(1) is None and big.smallest() == 2
    with pytest.raises(SpecError, match="cannot run on 1 GPU .* it runs on \\[2, 3, 4\\]"):
        size_job(JobSpec(command=("x",), model="big", gpus=1), book, 4)
    # no policy puts it on one GPU, even where one GPU is all that is free
    jobs = [JobSpec(emulate=True, model="never", steps=500)] * 3 + \
        [JobSpec(emulate=True, model="big", steps=500)]
    for name in ("marble", "moldable", "malleable", "elastic", "adaptive", "rigid",
                 "timeslice", "learned"):
        result = Simulator(book, get_policy(name), 4).run(jobs)
        assert all(len(r.gpus) >= 2 for r in result.runs if r.job == 4), name
    null_only = profile(tmp_path, "  m:\n    steps_per_second: [null, null]\n", "n.yaml")
    assert "is null for every count: the model could never run" in refused(null_only)


def write_trace(tmp_path, rows: str):
    path = tmp_path / "trace.csv"
    path.write_text("arrival,model,steps,gpus\n" + rows)
    return path


def test_trace_job_larger_than_a_node_names_file_line_and_limit(tmp_path):
    path = write_trace(tmp_path, "0,resnet-50,100,\n5,resnet-50,100,8\n")
    with pytest.raises(SpecError) as err:
        Simulator(load_profile(), get_policy("marble"), 6).run(read_trace(path))
    assert str(err.value) == (f"{path}:3: gpus: asks for 8 GPUs but the largest node has 6; "
                              "ask for at most 6 or use 'auto'")


def test_trace_unknown_model_names_it_and_lists_the_profiles_models(tmp_path):
    path = write_trace(tmp_path, "0,resnet-50,100,\n5,gpt-9,100,\n")
    with pytest.raises(SpecError) as err:
        Simulator(load_profile(), get_policy("marble"), 6).run(read_trace(path))
    assert str(err.value) == (
        f"{path}:3: model: 'gpt-9' is not in profile 'summit-v100', which has "
        "alexnet, inception-v3, lenet, resnet-101, resnet-50, vgg-16")
