"""The secret policy by name and by value: what is secret, and that no form of it survives redaction."""

from __future__ import annotations

import pytest

from bisect_eagle.tracking.redact import (
    REDACTED,
    Scrubber,
    digest_mapping,
    is_secret_name,
    is_secret_value,
    redact_argv,
    redact_mapping,
    redact_url,
    scrub,
    secret_values,
)

GHP = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
HF = "hf_" + "Yq7Lm2Pz9Xc4Vb8Nw3Kd"


@pytest.mark.parametrize("name", ["HF_TOKEN", "OPENAI_API_KEY", "--api-key", "NCCL_IB_PKEY", "HF_AUTH", "GH_PAT",
                                  "GOOGLE_APPLICATION_CREDENTIALS", "SESSION", "MY_COOKIE", "OAUTH", "DB_PASSWD"])
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["num_draft_tokens", "COMPAT_MODE", "NCCL_ALGO", "PATH", "SESSIONS_MAX", "AUTHOR"])
def test_names_that_are_not_secret(name):
    assert not is_secret_name(name)


@pytest.mark.parametrize("value", [GHP, HF, "github_pat_" + "x" * 30, "sk-" + "y" * 40, "AKIAABCDEFGHIJKLMNOP",
                                   "postgresql://u:pw@host/db", "ftp://user:password@h/x", "redis://:pw@h:6379"])
def test_values_secret_by_their_shape(value):
    assert is_secret_value(value)
    out = scrub(f"connecting to {value} now", [])
    assert "now" in out and value not in out


def test_a_url_keeps_all_but_its_password():
    assert redact_mapping({"DATABASE_URL": "postgresql://u:pw123@host/db"}) == {
        "DATABASE_URL": "postgresql://u:***@host/db"}
    assert redact_url("mysql+pymysql://bob:hunter2@db:3306/x") == "mysql+pymysql://bob:***@db:3306/x"
    assert redact_url("http://[::1") == "http://[::1"  # malformed: returned, never raises
    assert secret_values({"DATABASE_URL": "postgresql://u:pw123@host/db"}) == {"pw123"}


def test_a_token_under_an_innocent_name_is_masked_and_still_counts_for_identity():
    assert redact_mapping({"GREETING": HF, "N": 4}) == {"GREETING": REDACTED, "N": 4}
    assert digest_mapping({"GREETING": HF})["GREETING"].startswith("sha256:")
    assert digest_mapping({"GREETING": HF}) != digest_mapping({"GREETING": HF[:-1] + "Z"})
    assert redact_argv(["--note", HF, "--flag"]) == ["--note", REDACTED, "--flag"]


def test_inherited_values_are_scrubbed_from_server_output():
    scrubber = Scrubber(environ={"GH_PAT": "ghpat-Rt42secret", "PLAIN": "not-a-secret"})
    out = scrubber("env: GH_PAT=ghpat-Rt42secret PLAIN=not-a-secret " + GHP)
    assert "ghpat-Rt42secret" not in out and GHP not in out and "not-a-secret" in out
