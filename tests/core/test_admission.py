"""Admission (pure): a model is recorded under the profile's name, one the broker does not
know gets a note (with the profile's names it is close to), a dependency on a job that does
not exist is NotFound, and a batch's refusals count jobs from 1 with the JSON path as field."""

from __future__ import annotations

import pytest

from marbled.core.admission import admit
from marbled.core.errors import Invalid, NotFound
from marbled.core.learning import LearnedBook, Learning
from marbled.core.model import Node, State
from marbled.core.policy import POLICIES
from marbled.core.spec import JobSpec, SpecError
from marbled.resources import load_profile


@pytest.fixture(scope="module")
def profile():
    return load_profile("summit-v100")


@pytest.fixture
def learned(profile):
    return LearnedBook(profile, Learning(start_gpus=2), 6)


def state() -> State:
    return State(nodes={"n0": Node("n0", tuple(range(6)))})


def admitted(book, *docs, first_id=1, names=None, in_state=None):
    return admit([JobSpec.from_mapping(d) for d in docs], first_id=first_id,
                 state=in_state or state(), book=book, policy=POLICIES["marble"](),
                 names=names or {})


def job(model, **more):
    return {"model": model, "steps": 10, "command": ["python", "train.py"], **more}


@pytest.mark.parametrize("spelling", ["resnet50", "Resnet-50", "ResNet-50", "resnet_v1_50"])
def test_an_alias_is_recorded_under_the_profiles_name(learned, spelling):
    (a,) = admitted(learned, job(spelling))
    assert a.spec.model == "resnet-50"
    assert a.notes == ()


def test_a_typo_gets_a_note_with_the_closest_name_and_the_start_count(learned):
    (a,) = admitted(learned, job("resnt-50"))
    assert a.notes == ("model 'resnt-50' is not in profile summit-v100 (did you mean "
                       "resnet-50?); it will be explored from 2 GPUs",)
    assert a.spec.model == "resnt-50" and a.job.demand == 2


def test_a_new_model_the_user_means_gets_no_note(learned):
    (a,) = admitted(learned, job("my-transformer", new_model=True))
    assert a.notes == ()


def test_a_model_nothing_is_close_to_gets_a_note_without_a_guess(learned):
    (a,) = admitted(learned, job("my-transformer"))
    assert a.notes == ("model 'my-transformer' is not in profile summit-v100; it will be "
                       "explored from 2 GPUs",)


def test_a_fixed_count_of_an_unknown_model_says_it_runs_on_it(learned):
    (a,) = admitted(learned, job("vgg16x", gpus=1))
    assert a.notes == ("model 'vgg16x' is not in profile summit-v100 (did you mean vgg-16?); "
                       "it runs on the 1 GPU asked for",)


def test_a_model_learned_from_earlier_runs_is_known(learned):
    learned.record("my-net", "throughput", 5.0, 2)
    (a,) = admitted(learned, job("My_Net"))
    assert a.notes == () and a.spec.model == "my-net"  # under the name it was learned as
    (b,) = admitted(learned, job("my-nett"))
    assert "did you mean my-net?" in b.notes[0]


def test_without_learning_the_refusal_gains_the_suggestion(profile):
    with pytest.raises(SpecError) as info:
        admitted(profile, job("resnt-50"))
    assert info.value.field == "model"
    assert "no throughput curve in profile 'summit-v100': did you mean resnet-50?" \
        in str(info.value)
    assert "give an explicit GPU count" in str(info.value)


def test_an_emulated_typo_is_refused_with_the_suggestion(learned):
    with pytest.raises(SpecError, match="did you mean inception-v3?"):
        admitted(learned, {"emulate": True, "model": "inceptoin-v3", "steps": 5})


@pytest.mark.parametrize("after", [99, "nobody"])
def test_a_dependency_on_a_job_that_does_not_exist_is_not_found(learned, after):
    with pytest.raises(NotFound) as info:
        admitted(learned, job("resnet-50", after=[after]))
    assert info.value.field == "after"
    assert str(after) in str(info.value) and "before this one" in str(info.value)


def test_a_dependency_on_itself_or_a_later_job_of_the_request_is_not_found(learned):
    """No earlier job has that id (the client cannot know its request's ids): a 404, as for
    any job that is not there; the request is well formed (no document can refuse it)."""
    with pytest.raises(NotFound, match="job 1: after: job 2 is later in this request"):
        admitted(learned, job("resnet-50", after=[2]), job("resnet-50"))
    with pytest.raises(NotFound, match="job 1 is this job") as info:
        admitted(learned, job("resnet-50", after=[1]))
    assert info.value.field == "after"


def test_a_refusal_in_a_batch_counts_jobs_from_one_and_keeps_the_json_path(learned):
    with pytest.raises(NotFound) as info:
        admitted(learned, job("resnet-50"), job("resnet-50", after=[42]))
    assert info.value.field == "jobs[1].after"
    assert str(info.value).startswith("job 2: after: there is no job 42")
    with pytest.raises(Invalid) as info:
        admitted(learned, job("resnet-50"), job("resnet-50", gpus=9))
    assert info.value.field == "jobs[1].gpus" and str(info.value).startswith("job 2: gpus: ")


def test_a_dependency_by_name_on_an_earlier_job_of_the_batch(learned):
    first, second = admitted(learned, job("resnet-50", name="prep"),
                             job("vgg-16", after=["prep"]))
    assert second.job.after == (first.job.id,)


@pytest.mark.parametrize("model", ["x" * 129, "resnet 50", "net\n", "ré-net", "a;b"])
def test_a_model_name_has_limits(model):
    with pytest.raises(SpecError) as info:
        JobSpec.from_mapping(job(model))
    assert info.value.field == "model"
    assert "1 to 128 letters, digits and . _ + : / -" in str(info.value)


def test_a_huge_model_name_is_shown_cut_short():
    with pytest.raises(SpecError) as info:
        JobSpec.from_mapping(job("m" * 100_000))
    assert "(100000 characters)" in str(info.value) and len(str(info.value)) < 300


@pytest.mark.parametrize("model", ["resnet-50", "x" * 128, "facebook/opt-1.3b", "llama3:8b",
                                   "gpt2+lora"])
def test_model_names_within_the_limits(model):
    assert JobSpec.from_mapping(job(model)).model == model


def test_new_model_must_be_a_flag():
    with pytest.raises(SpecError) as info:
        JobSpec.from_mapping(job("net", new_model="yes"))
    assert info.value.field == "new_model"
