"""The distributed secret: read from the environment or an owner-only file, refused with the fix
when weak or exposed; signatures bind every part and their boundaries."""
import os

import pytest

from sharddit.parallel.distributed import secret

pytestmark = pytest.mark.no_blas  # no BLAS arithmetic: left out of the other-MKL_CBWR rerun in .ci/run


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv(secret.SECRET_ENV, raising=False)
    monkeypatch.delenv(secret.FILE_ENV, raising=False)
    return monkeypatch


def test_unset_is_none_and_a_good_secret_is_read(clean_env):
    assert secret.dist_secret() is None
    value = secret.new_secret()
    assert len(value) == 64 and value != secret.new_secret()
    clean_env.setenv(secret.SECRET_ENV, value)
    assert secret.dist_secret() == value.encode()


def test_short_secret_refused_with_how_to_make_one(clean_env):
    clean_env.setenv(secret.SECRET_ENV, "hunter2")
    with pytest.raises(ValueError, match=r"SHARDDIT_DIST_SECRET holds 7 characters, fewer than 32.*--new-secret"):
        secret.dist_secret()


def test_secret_file_must_be_owner_only(clean_env, tmp_path):
    path = tmp_path / "secret"
    path.write_text(secret.new_secret() + "\n")
    os.chmod(path, 0o644)
    clean_env.setenv(secret.FILE_ENV, str(path))
    with pytest.raises(ValueError, match=r"readable by others \(mode 644\); run `chmod 600"):
        secret.dist_secret()
    os.chmod(path, 0o600)
    assert secret.dist_secret() == path.read_text().strip().encode()
    clean_env.setenv(secret.SECRET_ENV, "x" * 40)
    with pytest.raises(ValueError, match="both SHARDDIT_DIST_SECRET and SHARDDIT_DIST_SECRET_FILE are set"):
        secret.dist_secret()


def test_missing_file_named(clean_env, tmp_path):
    clean_env.setenv(secret.FILE_ENV, str(tmp_path / "nope"))
    with pytest.raises(ValueError, match=r"nope' cannot be read \(No such file"):
        secret.dist_secret()


def test_signatures_bind_key_parts_and_boundaries():
    key, other = b"k" * 32, b"j" * 32
    mac = secret.sign(key, "offer", 3, b"\x00raw")
    assert secret.verify(key, mac, "offer", 3, b"\x00raw")
    assert not secret.verify(other, mac, "offer", 3, b"\x00raw")
    assert not secret.verify(key, mac, "offer", 4, b"\x00raw")
    assert secret.sign(key, "ab", "c") != secret.sign(key, "a", "bc")
    assert not secret.verify(key, None, "offer") and not secret.verify(key, mac.upper(), "offer", 3, b"\x00raw")


def test_a_signature_is_checked_whole_and_in_constant_time(monkeypatch):
    """Every hex digit counts (a prefix match is refused), and the comparison is
    ``hmac.compare_digest``, whose time does not depend on where the first difference is."""
    key = b"k" * 32
    mac = secret.sign(key, "offer", 3)
    assert len(mac) == 64
    forged = mac[:16] + ("0" if mac[16] != "0" else "1") + mac[17:]
    assert not secret.verify(key, forged, "offer", 3)
    compared = []
    real = secret.hmac.compare_digest
    monkeypatch.setattr(secret.hmac, "compare_digest", lambda a, b: compared.append((a, b)) or real(a, b))
    assert secret.verify(key, mac, "offer", 3)
    assert compared == [(mac, mac)]
