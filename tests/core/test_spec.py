"""JobSpec validation, job sizing and job-set files with located errors."""

from __future__ import annotations

import pytest

from marbled.core.spec import JobSpec, SpecError, expand_run_vars, size_job
from marbled.resources import JobFileError, load_job_file, load_profile


@pytest.fixture(scope="module")
def book():
    return load_profile("summit-v100")


def spec(**fields) -> JobSpec:
    return JobSpec.from_mapping(fields)


def emulated(**fields) -> JobSpec:
    return spec(**{"emulate": True, "model": "resnet-50", "steps": 100, **fields})


def spec_error(doc) -> SpecError:
    with pytest.raises(SpecError) as info:
        JobSpec.from_mapping(doc)
    return info.value


# ---------------------------------------------------------------- from_mapping


def test_minimal_job_with_a_command_list():
    s = spec(command=["python", "train.py", "--lr", "0.1"])
    assert s.command == ("python", "train.py", "--lr", "0.1")
    assert s.emulate is False
    assert s.gpus is None and s.model is None and s.steps is None
    assert s.after == () and s.name is None


def test_command_string_is_split_like_a_shell():
    s = spec(command="python train.py --name 'my run' --x=\"a b\"")
    assert s.command == ("python", "train.py", "--name", "my run", "--x=a b")


def test_command_string_that_cannot_be_split():
    assert spec_error({"command": "echo 'unterminated"}).field == "command"


@pytest.mark.parametrize("command", [[], "", ["ok", 3], 42])
def test_bad_or_empty_command(command):
    assert spec_error({"command": command}).field == "command"


def test_command_and_emulate_are_exclusive():
    err = spec_error({"command": ["x"], "emulate": True, "model": "vgg-16", "steps": 5})
    assert err.field == "command"


def test_emulated_job():
    s = emulated(model="vgg-16", steps=800)
    assert s.emulate is True and s.command == ()
    assert (s.model, s.steps) == ("vgg-16", 800)


def test_emulate_requires_model():
    assert spec_error({"emulate": True, "steps": 5}).field == "model"


def test_emulate_requires_steps():
    assert spec_error({"emulate": True, "model": "vgg-16"}).field == "steps"


@pytest.mark.parametrize("field", ["gpu", "Steps", "priority"])
def test_unknown_field_is_named(field):
    err = spec_error({"command": ["x"], field: 1})
    assert err.field == field
    assert "known fields" in err.message
    assert str(err).startswith(f"{field}: ")


def test_non_mapping_job():
    assert spec_error(["command", "x"]).field == "job"


@pytest.mark.parametrize("steps", [0, -1, True, "5", 2.5, 10**12 + 1])
def test_bad_steps_are_rejected(steps):
    assert spec_error({"command": ["x"], "steps": steps}).field == "steps"


def test_largest_step_count_is_accepted():
    assert spec(command=["x"], steps=10**12).steps == 10**12


@pytest.mark.parametrize("gpus", [0, -3, True, "2", 1.5, "all"])
def test_bad_gpus_are_rejected(gpus):
    assert spec_error({"command": ["x"], "gpus": gpus}).field == "gpus"


@pytest.mark.parametrize("gpus", ["auto", None])
def test_gpus_auto_means_none(gpus):
    assert spec(command=["x"], gpus=gpus).gpus is None


def test_gpus_explicit_count():
    assert spec(command=["x"], gpus=2).gpus == 2


@pytest.mark.parametrize("name", ["123", "0", "007"])
def test_all_digit_name_is_rejected(name):
    err = spec_error({"command": ["x"], "name": name})
    assert err.field == "name"
    assert "digits" in err.message


@pytest.mark.parametrize("name", ["", "x" * 129, 5])
def test_bad_name_is_rejected(name):
    assert spec_error({"command": ["x"], "name": name}).field == "name"


def test_name_with_digits_and_letters_is_fine():
    assert spec(command=["x"], name="run42").name == "run42"


@pytest.mark.parametrize(
    ("after", "expected"),
    [(3, (3,)), ("prep", ("prep",)), ([1, "prep", 7], (1, "prep", 7)), ([], ())],
)
def test_after_accepts_ids_names_and_lists(after, expected):
    assert spec(command=["x"], after=after).after == expected


@pytest.mark.parametrize("after", [True, 0, -1, "", [1, None], {"a": 1}, [False]])
def test_bad_after_is_rejected(after):
    assert spec_error({"command": ["x"], "after": after}).field == "after"


@pytest.mark.parametrize("chdir", ["", 7, ["/a"], "/a\0b", "/" + "x" * 4096])
def test_bad_chdir_is_rejected(chdir):
    err = spec_error({"command": ["x"], "chdir": chdir})
    assert err.field == "chdir" and ("directory path" in err.message or "NUL" in err.message)


@pytest.mark.parametrize("chdir, base, expected", [
    (None, "/home/u/project", "/home/u/project"),  # none named: where it was submitted
    ("data/run1", "/home/u/project", "/home/u/project/data/run1"),  # relative: from there
    ("../other", "/home/u/project", "/home/u/other"),
    ("/scratch/u", "/home/u/project", "/scratch/u"),  # absolute: as given
])
def test_run_from_makes_the_directory_absolute(chdir, base, expected):
    assert spec(command=["x"], chdir=chdir).run_from(base).chdir == expected


def test_to_mapping_round_trips():
    s = spec(command=["a", "b"], model="vgg-16", steps=9, gpus=2, after=[1, "x"], name="n",
             chdir="/tmp", per_gpu=True)
    assert JobSpec.from_mapping(s.to_mapping()) == s
    s2 = emulated()
    assert JobSpec.from_mapping(s2.to_mapping()) == s2


def test_per_gpu_is_a_flag():
    assert spec(command=["python", "train.py"], per_gpu=True).per_gpu is True
    assert spec(command=["python", "train.py"]).per_gpu is False
    error = spec_error({"command": "python t.py", "per_gpu": "yes"})
    assert (error.field, error.message) == ("per_gpu", "must be true or false")


@pytest.mark.parametrize("command", ["torchrun --standalone t.py", "/opt/bin/torchrun t.py",
                                     "python -m torch.distributed.run t.py"])
def test_per_gpu_refuses_torchrun_which_starts_the_ranks_itself(command):
    error = spec_error({"command": command, "per_gpu": True})
    assert error.field == "per_gpu"
    assert "torchrun starts one process per GPU itself" in error.message
    assert spec(command=command).command[-1] == "t.py"  # without per_gpu: fine


def test_the_runs_variables_are_put_into_the_command():
    env = {"MARBLE_GPUS": "3", "MARBLE_JOB_ID": "7"}
    assert expand_run_vars(("torchrun", "--nproc-per-node=$MARBLE_GPUS", "${MARBLE_JOB_ID}.py",
                            "$HOME", "$MARBLE_NOT_SET", "$$"), env) == \
        ("torchrun", "--nproc-per-node=3", "7.py", "$HOME", "$MARBLE_NOT_SET", "$$")


# ---------------------------------------------------------------- size_job


def test_explicit_gpus_beyond_the_node_name_the_node_size(book):
    with pytest.raises(SpecError) as info:
        size_job(spec(command=["x"], gpus=7), book, 6)
    assert info.value.field == "gpus"
    assert "6" in info.value.message
    assert "largest node has 6" in info.value.message


def test_explicit_gpus_equal_to_the_node_fit(book):
    sizing = size_job(spec(command=["x"], gpus=6), book, 6)
    assert (sizing.demand, sizing.malleable) == (6, False)


def test_unknown_model_without_gpus_lists_known_models(book):
    with pytest.raises(SpecError) as info:
        size_job(spec(command=["x"], model="resnet-152"), book, 6)
    assert info.value.field == "model"
    assert "resnet-152" in info.value.message
    for known in ("resnet-50", "inception-v3", "vgg-16"):
        assert known in info.value.message


def test_emulated_unknown_model_is_rejected_even_with_gpus(book):
    with pytest.raises(SpecError) as info:
        size_job(emulated(model="resnet-152", gpus=2), book, 6)
    assert info.value.field == "model"
    assert "vgg-16" in info.value.message


def test_no_model_and_no_gpus(book):
    with pytest.raises(SpecError) as info:
        size_job(spec(command=["x"]), book, 6)
    assert info.value.field == "gpus"


@pytest.mark.parametrize(
    ("model", "demand"),
    [("resnet-50", 3), ("Inception-v3", 4), ("resnet_v1_101", 3), ("VGG-16", 5)],
)
def test_known_model_gets_its_optimal_count_and_is_malleable(book, model, demand):
    sizing = size_job(spec(command=["x"], model=model), book, 6)
    assert sizing.demand == demand
    assert sizing.malleable is True


def test_optimal_count_is_capped_by_the_node(book):
    sizing = size_job(emulated(model="vgg-16"), book, 4)
    assert sizing.demand == 4 and sizing.malleable is True


def test_explicit_gpus_make_the_job_rigid(book):
    sizing = size_job(emulated(model="vgg-16", gpus=2), book, 6)
    assert sizing.demand == 2
    assert sizing.malleable is False


# ---------------------------------------------------------------- job files


def test_job_file_error_names_file_line_and_job(tmp_path):
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "# a comment\n"
        "jobs:\n"
        "  - {model: resnet-50, steps: 10, emulate: true}\n"
        "\n"
        "  - model: vgg-16\n"
        "    steps: 0\n"
        "    emulate: true\n"
    )
    with pytest.raises(JobFileError) as info:
        load_job_file(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}:5: job 2: ")
    assert "steps" in msg


def test_job_file_error_in_a_top_level_list(tmp_path):
    path = tmp_path / "list.yaml"
    lines = [
        "- command: [echo, hi]",
        "- command: [echo, ho]",
        "- command: [echo, x]",  # line 3
        "  colour: red",
    ]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(JobFileError) as info:
        load_job_file(path)
    assert str(info.value).startswith(f"{path}:3: job 3: colour: ")


def test_job_file_with_valid_jobs(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text(
        "jobs:\n"
        "  - {model: resnet-50, steps: 10, emulate: true, name: first}\n"
        "  - {command: 'python t.py', gpus: 2, after: first}\n"
    )
    specs = load_job_file(path)
    assert [s.name for s in specs] == ["first", None]
    assert specs[1].command == ("python", "t.py") and specs[1].after == ("first",)


def test_invalid_yaml_names_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("jobs:\n  - {model: resnet-50, steps: [\n")
    with pytest.raises(JobFileError) as info:
        load_job_file(path)
    assert str(info.value).startswith(f"{path}: ")
    assert "not valid YAML" in str(info.value)


@pytest.mark.parametrize("text", ["", "jobs: []\n", "hello\n", "{a: 1}\n"])
def test_job_file_without_jobs(tmp_path, text):
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    with pytest.raises(JobFileError, match="non-empty list of jobs") as info:
        load_job_file(path)
    assert str(path) in str(info.value)


def test_missing_job_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(JobFileError, match="cannot read") as info:
        load_job_file(path)
    assert str(path) in str(info.value)
