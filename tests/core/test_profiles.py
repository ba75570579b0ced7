"""The reconstructed Summit V100 profile against the facts the MARBLE paper states."""

from __future__ import annotations

import copy

import pytest

from marbled.core.profiles import ProfileBook, ProfileError, ThroughputCurve, model_key
from marbled.resources import load_job_file, load_profile, workload_path

PAPER_MODELS = ("resnet-50", "inception-v3", "resnet-101", "vgg-16")
NODE = 6


@pytest.fixture(scope="module")
def book() -> ProfileBook:
    return load_profile("summit-v100")


def alpha(curve: ThroughputCurve) -> float:
    """1 - thr(6) / thr(optimal): what running on the whole node costs (paper V-A)."""
    return 1.0 - curve.throughput(NODE) / curve.throughput(curve.optimal_gpus(NODE))


def all_curves(book: ProfileBook) -> list[ThroughputCurve]:
    return [book.lookup(m) for m in book.models]


# ---------------------------------------------------------------- paper facts


def test_profile_describes_a_six_gpu_summit_node(book):
    assert book.system == "summit-v100"
    assert book.gpus_per_node == NODE
    for model in PAPER_MODELS:
        assert book.lookup(model) is not None, model
        assert book.lookup(model).max_gpus == NODE


@pytest.mark.parametrize(
    ("model", "optimal"),
    [("resnet-50", 3), ("inception-v3", 4), ("resnet-101", 3), ("vgg-16", 5)],
)
def test_optimal_gpu_counts_match_the_paper(book, model, optimal):
    assert book.lookup(model).optimal_gpus() == optimal
    assert book.lookup(model).optimal_gpus(NODE) == optimal


def test_vgg16_alpha_is_2_91_percent(book):
    vgg = book.lookup("vgg-16")
    value = 1.0 - vgg.throughput(6) / vgg.throughput(5)
    assert value * 100 == pytest.approx(2.91, abs=0.01)
    assert alpha(vgg) * 100 == pytest.approx(2.91, abs=0.01)


def test_no_model_has_a_larger_alpha_than_vgg16(book):
    for curve in all_curves(book):
        assert alpha(curve) * 100 <= 2.91 + 1e-6, curve.model


def test_vgg16_speedup_on_six_gpus_is_3_3(book):
    assert book.lookup("vgg-16").speedup(6) == pytest.approx(3.3, abs=0.01)


def test_no_model_exceeds_3_3x_on_six_gpus(book):
    for curve in all_curves(book):
        assert curve.speedup(6) <= 3.3 + 0.01, curve.model


@pytest.mark.parametrize("model", ["lenet", "resnet-50", "vgg-16"])
def test_models_that_degrade_on_six_gpus(book, model):
    curve = book.lookup(model)
    assert curve.throughput(6) < curve.throughput(5)


@pytest.mark.parametrize(("jobset", "seconds"), [(1, 958.0), (2, 940.0), (3, 707.0)])
def test_lsf_baseline_of_the_paper_job_sets(book, jobset, seconds):
    specs = load_job_file(workload_path(f"paper-jobset{jobset}"))
    assert len(specs) == 3
    total = sum(spec.steps / book.lookup(spec.model).throughput(6) for spec in specs)
    assert total == pytest.approx(seconds, rel=0.01)


# ---------------------------------------------------------------- lookups


def test_model_key_normalises_case_and_punctuation():
    assert model_key("ResNet-50") == "resnet50"
    assert model_key("resnet_50") == model_key("RESNET 50") == "resnet50"


def test_lookup_ignores_spelling_of_the_model_name(book):
    curve = book.lookup("resnet-50")
    assert curve is not None
    for spelling in ("ResNet-50", "resnet50", "resnet_50", "RESNET-50"):
        assert book.lookup(spelling) is curve, spelling
    assert book.lookup("resnet_v1_50") is curve  # alias
    assert book.lookup("Inception-v3") is book.lookup("inception_v3")
    assert book.lookup("resnet-152") is None


def test_models_lists_each_model_once(book):
    assert book.models == sorted(
        ["alexnet", "inception-v3", "lenet", "resnet-101", "resnet-50", "vgg-16"]
    )


def test_optimal_gpus_respects_the_limit(book):
    vgg = book.lookup("vgg-16")
    assert vgg.optimal_gpus(3) == 3
    assert vgg.optimal_gpus(1) == 1
    assert vgg.optimal_gpus(100) == 5
    assert book.lookup("inception-v3").optimal_gpus(2) == 2


def test_optimal_gpus_ties_go_to_fewer_gpus():
    curve = ThroughputCurve("flat", (1.0, 2.0, 2.0, 2.0))
    assert curve.optimal_gpus() == 2
    assert ThroughputCurve("same", (3.0, 3.0, 3.0)).optimal_gpus() == 1
    assert ThroughputCurve("late", (1.0, 2.0, 1.5, 2.0)).optimal_gpus() == 2


def test_throughput_is_flat_beyond_the_profiled_range():
    curve = ThroughputCurve("short", (1.0, 1.5))
    assert curve.throughput(8) == 1.5
    with pytest.raises(ValueError):
        curve.throughput(0)


# ---------------------------------------------------------------- from_mapping errors


BASE_DOC = {
    "system": "test",
    "gpus_per_node": 4,
    "models": {
        "x": {"steps_per_second": [1.0, 2.0, 2.5, 2.4], "aliases": ["X-1"]},
        "y": {"steps_per_second": [1.0, 1.5]},
    },
}


def doc(**changes) -> dict:
    out = copy.deepcopy(BASE_DOC)
    out.update(changes)
    return out


def test_from_mapping_accepts_the_base_document():
    book = ProfileBook.from_mapping(doc())
    assert book.lookup("X-1") is book.lookup("x")
    assert book.lookup("x").optimal_gpus() == 3


def test_unknown_top_level_field_is_named():
    with pytest.raises(ProfileError, match="top level") as info:
        ProfileBook.from_mapping(doc(colour="blue"), source="p.yaml")
    assert "colour" in str(info.value)
    assert str(info.value).startswith("p.yaml: ")


@pytest.mark.parametrize("bad", [[1.0, 0.0], [1.0, -2.0], [], "fast", [1.0, "2"]])
def test_non_positive_throughput_names_the_field(bad):
    d = doc()
    d["models"]["x"]["steps_per_second"] = bad
    with pytest.raises(ProfileError) as info:
        ProfileBook.from_mapping(d)
    assert "models.x.steps_per_second" in str(info.value)


def test_duplicate_alias_names_the_model_and_the_key():
    d = doc()
    d["models"]["y"]["aliases"] = ["x_1"]  # same key as x's alias 'X-1'
    with pytest.raises(ProfileError) as info:
        ProfileBook.from_mapping(d)
    assert "models.y" in str(info.value)
    assert "x1" in str(info.value)


def test_alias_clashing_with_another_model_name_is_rejected():
    d = doc()
    d["models"]["y"]["aliases"] = ["X"]
    with pytest.raises(ProfileError, match="models.y"):
        ProfileBook.from_mapping(d)


def test_unknown_model_field_is_named():
    d = doc()
    d["models"]["x"]["speed"] = 3
    with pytest.raises(ProfileError) as info:
        ProfileBook.from_mapping(d)
    assert "models.x" in str(info.value) and "speed" in str(info.value)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"system": ""}, "system"),
        ({"gpus_per_node": 0}, "gpus_per_node"),
        ({"models": {}}, "models"),
    ],
)
def test_other_bad_fields_are_named(changes, field):
    with pytest.raises(ProfileError) as info:
        ProfileBook.from_mapping(doc(**changes), source="s")
    assert str(info.value).startswith(f"s: {field}: ")


def test_non_mapping_document_is_rejected():
    with pytest.raises(ProfileError, match="top level"):
        ProfileBook.from_mapping(["not", "a", "mapping"])


def test_profile_file_errors_name_file_line_and_field(tmp_path):
    from marbled.resources import load_profile as load

    bad = tmp_path / "bad.yaml"
    bad.write_text("system: x\ngpus_per_node: 6\nmodels:\n  resnet-50:\n"
                   "    steps_per_second: [1.0, 2.0]\n  vgg-16:\n"
                   "    steps_per_second: [1.0, -2.0]\n")
    with pytest.raises(ProfileError) as err:
        load(str(bad))
    assert f"{bad}:7: models.vgg-16.steps_per_second" in str(err.value)
