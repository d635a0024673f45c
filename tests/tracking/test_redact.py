"""The secret policy: values in clear only under known harmless names, every other one hashed, free
text masked by shape (glued tokens, token-only URLs included)."""

from __future__ import annotations

import pytest

from bisect_eagle.tracking.redact import (
    REDACTED,
    Scrubber,
    digest_mapping,
    env_in_clear,
    flag_in_clear,
    hidden,
    is_credential_name,
    is_hidden,
    is_secret_value,
    mask_text,
    redact_argv,
    redact_env,
    redact_mapping,
    redact_url,
    scrub,
    secret_values,
)

GHP = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
HF = "hf_" + "Yq7Lm2Pz9Xc4Vb8Nw3Kd"
SK = "sk-" + "proj" + "Vb64xQ81mN0pL2kJ7hG5"


@pytest.mark.parametrize(
    "name",
    [
        "NCCL_ALGO",
        "NCCL_PROTO",
        "NCCL_DEBUG",
        "SGLANG_ENABLE_JIT_DEEPGEMM",
        "VLLM_LOGGING_LEVEL",
        "SGLANG_SIMULATE_ACC_LEN",
    ],
)
def test_known_variables_are_in_clear(name):
    assert env_in_clear(name)
    assert redact_env({name: "Ring"}) == {name: "Ring"}


@pytest.mark.parametrize(
    "name",
    [
        "NCCL_PASSPHRASE",
        "MY_CREDS",
        "SGLANG_BEARER",
        "SGLANG_PASSPHRASE",
        "PATH",
        "DATABASE_URL",
        "HF_TOKEN",
        "VLLM_API_KEY",
        "EXA_API_KEY",
        "NCCL_IB_PKEY",
    ],
)
def test_every_other_variable_is_hashed(name):
    assert not env_in_clear(name)
    assert redact_env({name: "plain-value"}) == {name: hidden("plain-value")}
    assert is_hidden(hidden("plain-value")) and "plain-value" not in hidden("plain-value")


def test_engine_flags_are_in_clear_but_credential_flags_are_not():
    assert flag_in_clear("--max-model-len") and flag_in_clear("mem_fraction_static")
    assert (
        not flag_in_clear("--api-key")
        and not flag_in_clear("hf_token")
        and not flag_in_clear("--my-own")
    )
    assert redact_argv(
        ["srv", "--tp-size", "2", "--api-key", "k-123", "--hf-token=t-456", "--my-own", "x"]
    ) == [
        "srv",
        "--tp-size",
        "2",
        "--api-key",
        hidden("k-123"),
        f"--hf-token={hidden('t-456')}",
        "--my-own",
        hidden("x"),
    ]


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "OPENAI_API_KEY",
        "--api-key",
        "NCCL_IB_PKEY",
        "GH_PAT",
        "SGLANG_PASSPHRASE",
        "SGLANG_BEARER",
        "MY_CREDS",
        "DB_PASSWD",
    ],
)
def test_credential_names(name):
    assert is_credential_name(name)


def test_settings_hash_env_and_flags_by_name_and_keep_their_own_fields():
    settings = {
        "num_steps": 3,
        "env": {"NCCL_ALGO": "Ring", "MY_CREDS": "c-789"},
        "server_args": {"tp_size": 2, "api_key": "k-123"},
        "env.NCCL_PASSPHRASE": "p-000",
        "extra_args": ["--api-key", "k-124"],
    }
    assert redact_mapping(settings) == {
        "num_steps": 3,
        "env": {"NCCL_ALGO": "Ring", "MY_CREDS": hidden("c-789")},
        "server_args": {"tp_size": 2, "api_key": hidden("k-123")},
        "env.NCCL_PASSPHRASE": hidden("p-000"),
        "extra_args": ["--api-key", hidden("k-124")],
    }
    assert secret_values(settings) == {"c-789", "k-123", "p-000", "k-124"}


def test_distinct_hidden_values_keep_distinct_identities():
    a, b = {"env": {"MY_CREDS": "one"}}, {"env": {"MY_CREDS": "two"}}
    assert digest_mapping(a) != digest_mapping(b) and redact_mapping(a) != redact_mapping(b)
    assert digest_mapping(a)["env"]["MY_CREDS"].startswith("sha256:") and "one" not in str(
        digest_mapping(a)
    )


@pytest.mark.parametrize(
    "value",
    [
        GHP,
        HF,
        SK,
        "github_pat_" + "x" * 30,
        "AKIAABCDEFGHIJKLMNOP",
        "x-" + HF,
        "key_" + SK,
        "pre-" + GHP,
        "id_AKIAABCDEFGHIJKLMNOP",
    ],
)
def test_tokens_are_masked_in_free_text_glued_ones_too(value):
    out = mask_text(f"connecting with {value} now")
    assert is_secret_value(value) and "now" in out and REDACTED in out
    assert HF not in out and GHP not in out and SK not in out and "AKIAABCDEFGHIJKLMNOP" not in out


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:pw123@host/db", "postgresql://u:***@host/db"),
        ("https://tok3nValue99@example.com/x", "https://***@example.com/x"),
        ("https://user:hunter2@example.com", "https://user:***@example.com"),
        ("sqlite:////tmp/x.db", "sqlite:////tmp/x.db"),
    ],
)
def test_url_credentials_are_masked_token_only_ones_too(url, shown):
    assert mask_text(f"see {url} here") == f"see {shown} here"
    assert redact_url(url) == shown


def test_a_malformed_url_never_raises():
    assert redact_url("http://[::1") == "http://[::1"


def test_clear_values_are_still_masked_by_shape():
    assert redact_env({"NCCL_DEBUG_FILE": f"/tmp/{HF}/x"}) == {
        "NCCL_DEBUG_FILE": f"/tmp/{REDACTED}/x"
    }


def test_inherited_secrets_are_scrubbed_from_server_output():
    environ = {
        "SGLANG_BEARER": "bearer-Rt42",
        "GH_PAT": "ghpat-Rt42secret",
        "SGLANG_LOG_GC": "debug",
        "PLAIN": "not-a-secret",
    }
    scrubber = Scrubber({"env": {"MY_CREDS": "creds-Lm55"}}, environ=environ)
    out = scrubber(
        "env: SGLANG_BEARER=bearer-Rt42 GH_PAT=ghpat-Rt42secret MY_CREDS=creds-Lm55 "
        f"SGLANG_LOG_GC=debug PLAIN=not-a-secret {GHP}"
    )
    assert "bearer-Rt42" not in out and "ghpat-Rt42secret" not in out and "creds-Lm55" not in out
    assert GHP not in out and "not-a-secret" in out and "SGLANG_LOG_GC=debug" in out


def test_scrub_leaves_short_values_alone():
    assert scrub("1 and 0", ["1", "0"]) == "1 and 0"
