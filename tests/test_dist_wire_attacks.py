"""Attacks on the control channel (issue 23), against a real host session over gloo on 127.0.0.1:
a member that answers with a pickle, one that announces a 1 TiB message, one with another secret.
Each is refused with an error naming it, before anything of its message is used or allocated; the
pickle's command never runs (its marker file is never written); the worker with the wrong secret
is told so; the lobby opens no half-joined session."""
import time

import pytest
from harness import dist_attacks, dist_procs
from sharddit.parallel.distributed.host import DistWorkerError
from sharddit.parallel.distributed.lobby import Lobby

pytestmark = pytest.mark.no_blas  # no BLAS arithmetic: left out of the other-MKL_CBWR rerun in .ci/run

TIMEOUT_S = 8.0
ATTACKS = ("pickle", "huge", "wrong_secret")


@pytest.fixture(scope="module")
def attackers(tmp_path_factory):
    """One lobby, one attacking member per attack, started together (one spawn's wait for all)."""
    tmp = tmp_path_factory.mktemp("attacks")
    lobby = Lobby("127.0.0.1", dist_procs.free_port(), TIMEOUT_S)
    procs = {a: dist_attacks.start_attacker(lobby.port, a.replace("_", "-"), a, str(tmp / f"{a}.marker"),
                                            str(tmp / f"{a}.log")) for a in ATTACKS}
    try:
        for a, proc in procs.items():
            dist_procs.wait_joined(lobby, f"{a.replace('_', '-')}/cpu", proc)
        yield lobby, procs, tmp
    finally:
        lobby.close()
        for proc in procs.values():
            if proc.is_alive():
                proc.kill()
            proc.join(10)


def _session_with(attackers, attack):
    lobby, procs, tmp = attackers
    member = f"{attack.replace('_', '-')}/cpu"
    with pytest.raises(DistWorkerError) as err:
        lobby.session_for((member,), (), "gloo", {member: "cpu"})
    assert lobby.session is None  # nothing half-joined: the next prompt opens a fresh session
    procs[attack].join(20)
    log = tmp / f"{attack}.log"
    return str(err.value), tmp / f"{attack}.marker", log.read_text() if log.exists() else ""


def test_a_pickled_answer_never_runs(attackers):
    error, marker, _ = _session_with(attackers, "pickle")
    time.sleep(0.5)
    assert not marker.exists(), "the host unpickled a member's message"
    assert "worker 'pickle'" in error and "does not hold this host's secret" in error, error


def test_an_oversized_length_word_is_refused_before_allocation(attackers):
    error, _, _ = _session_with(attackers, "huge")
    assert "worker 'huge'" in error and "control header of 1099511627776 bytes announced" in error, error


def test_a_worker_with_another_secret_is_told_so(attackers):
    error, _, worker_log = _session_with(attackers, "wrong_secret")
    assert "does not hold this host's secret" in error and "SHARDDIT_DIST_SECRET" in error, error
    assert "refused: this worker's secret differs from the host's" in worker_log, worker_log
    assert "in session" not in worker_log  # it never served a command
