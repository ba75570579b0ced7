"""A job's environment as sbatch's --export gives it (core/environment.py, pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from marbled.core.environment import Environment, never_exported, parse_export
from marbled.core.spec import JobSpec, SpecError

SHELL = {"PATH": "/venv/bin:/usr/bin", "HOME": "/home/u", "FOO": "1", "PWD": "/here",
         "SLURM_JOB_ID": "999", "MARBLE_STATE_DIR": "/s", "CUDA_VISIBLE_DEVICES": "3",
         "BASH_FUNC_ml%%": "() { :; }"}
BROKER = {"PATH": "/usr/bin", "SLURM_JOB_ID": "42", "SLURM_NODELIST": "n1", "ONLY_HERE": "b"}


def test_all_takes_the_shell_but_what_marbled_or_the_allocation_sets():
    env = Environment.from_mapping("ALL", environ=SHELL)
    assert env.whole and env.as_dict() == {"PATH": "/venv/bin:/usr/bin", "HOME": "/home/u",
                                           "FOO": "1"}
    # a run: the job's variables, and the broker's allocation's, never the broker's others
    assert env.overlay(BROKER) == {"PATH": "/venv/bin:/usr/bin", "HOME": "/home/u",
                                   "FOO": "1", "SLURM_JOB_ID": "42", "SLURM_NODELIST": "n1"}


@pytest.mark.parametrize("export, whole, named", [
    ("NONE", False, []), ("none", False, []), ("ALL", True, []),
    ("FOO", False, [("FOO", None)]), ("ALL,A=1,B", True, [("A", "1"), ("B", None)]),
    ("A=x=y", False, [("A", "x=y")]),
])
def test_sbatch_export_syntax(export, whole, named):
    assert parse_export(export) == (whole, named)


def test_a_list_adds_to_the_brokers_environment():
    env = Environment.from_mapping("FOO,BAR=2", environ=SHELL)
    assert not env.whole and env.overlay(BROKER) == {**BROKER, "FOO": "1", "BAR": "2"}
    assert Environment.from_mapping("NONE", environ=SHELL).is_default


@pytest.mark.parametrize("doc, field, says", [
    ({"export": "FOO"}, "export", "ALL or NONE here"),  # names resolve at the client only
    ({"env": {"SLURM_JOB_ID": "1"}}, "env", "set by marbled or the allocation"),
    ({"env": {"MARBLE_RUN_ID": "1"}}, "env", "set by marbled"),
    ({"env": {"A": 1}}, "env", "string values"),
    ({"env": ["A"]}, "env", "string values"),
    ({"env": {"A": "\ud800"}}, "env", "lone surrogate"),
    ({"env": {"A": "x" * (1 << 20)}}, "env", "at most"),
    ({"export": ""}, "export", "ALL, NONE or"),
    ({"export": None}, "export", "ALL, NONE or"),  # null is not absent
    ({"env": None}, "env", "string values"),
])
def test_the_broker_refuses_what_no_job_may_be_given(doc, field, says):
    with pytest.raises(SpecError) as refused:
        JobSpec.from_mapping({"command": ["true"], "gpus": 1, **doc})
    assert refused.value.field == field and says in refused.value.message


def test_never_exported():
    for name in ("SLURM_JOB_ID", "LSB_JOBID", "JSM_NAMESPACE_RANK", "MARBLE_RUN_ID", "RANK",
                 "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "TORCHELASTIC_RUN_ID"):
        assert never_exported(name)
    for name in ("PATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "MODULEPATH", "OMP_NUM_THREADS"):
        assert not never_exported(name)


names = st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True).filter(
    lambda n: not never_exported(n))


@given(st.dictionaries(names, st.text(st.characters(blacklist_categories=("Cs",),
                                                    blacklist_characters="\0")), max_size=8),
       st.booleans())
def test_the_api_form_round_trips_and_the_digest_names_the_content(env, whole):
    """What marble submit sends is what the broker rebuilds, and equal environments share a
    digest (the jobs of a request store theirs once)."""
    sent = Environment(tuple(sorted(env.items())), whole)
    mapping = sent.to_mapping()
    again = Environment.from_mapping(mapping["export"], mapping["env"])
    assert again == sent and again.digest == sent.digest
    spec = JobSpec.from_mapping({"command": ["true"], "gpus": 1, **mapping})
    assert JobSpec.from_mapping(spec.to_mapping()).environment == spec.environment
