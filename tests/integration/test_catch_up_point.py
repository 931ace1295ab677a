"""CatchUpPoint (internal key 1001, stonemq/handlers/catchup.py) on a real two-broker cluster:
the leader's answer is one consistent point (every topic partition of the journal partition
listed once, ending at what is split below the point), and the checks in ReplicaFetch's order
fence a stale or future leader epoch, a broker that is not a replica, and a broker that does
not lead it."""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from stonemq.protocol.catchup import (
    CatchUpRequest,
    CatchUpResponse,
    decode_response,
    encode_request,
)

from .replica_peer import journal_states
from .test_replication import _produce_all, _start_cluster, _wait, _watermarks

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def _ask(broker: Any, request: CatchUpRequest) -> CatchUpResponse:
    with socket.create_connection((broker.host, broker.port), timeout=10) as sock:
        sock.sendall(encode_request(request, 5))
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
            chunk = sock.recv(1 << 16)
            assert chunk, "connection closed"
            data += chunk
    cid, response = decode_response(data[4:])
    assert cid == 5
    return response


def test_the_leaders_point_and_its_fencing(broker_factory, zookeeper) -> None:
    brokers, chroot = _start_cluster(broker_factory, zookeeper, ids=(1, 2))
    by_id = {int(b.settings["broker_id"]): b for b in brokers}
    admin = AdminClient({"bootstrap.servers": brokers[0].bootstrap})
    admin.create_topics([NewTopic("point", 6, 2)])["point"].result(30)
    _wait(lambda: all(len(s.isr) == 2 for s in journal_states(chroot).values()), 30, "full ISR")
    assert len(_produce_all(brokers[0].bootstrap, "point", 120, b"p")) == 120
    time.sleep(1)  # split on the leaders
    ends = {p: hw for p, (_, hw) in enumerate(_watermarks(brokers[0].bootstrap, "point"))}
    listed: dict[int, int] = {}
    for j, state in journal_states(chroot).items():
        leader = by_id[state.leader]
        follower = next(b for b in by_id if b != state.leader)
        answer = _ask(leader, CatchUpRequest(follower, j, state.leader_epoch))
        assert answer.error_code == ErrorCode.none
        assert answer.leader_epoch == state.leader_epoch
        assert 0 <= answer.journal_start <= answer.point
        assert answer.epochs and all(start <= answer.point for _, start in answer.epochs)
        for p in answer.partitions:
            if p.topic == "point":
                assert p.partition not in listed  # one journal partition each
                listed[p.partition] = p.end_offset
                assert p.log_start_offset == 0
        # fenced: an older epoch, a newer one, a broker that is no replica, a non-leader
        if state.leader_epoch > 0:
            stale = _ask(leader, CatchUpRequest(follower, j, state.leader_epoch - 1))
            assert stale.error_code == ErrorCode.fenced_leader_epoch
        newer = _ask(leader, CatchUpRequest(follower, j, state.leader_epoch + 1))
        assert newer.error_code == ErrorCode.unknown_leader_epoch
        stranger = _ask(leader, CatchUpRequest(99, j, state.leader_epoch))
        assert stranger.error_code == ErrorCode.not_leader_or_follower
        other = _ask(by_id[follower], CatchUpRequest(state.leader, j, state.leader_epoch))
        assert other.error_code == ErrorCode.not_leader_or_follower
        assert (other.point, other.partitions) == (-1, ())
    assert listed == ends  # every partition once, at its end (all split and below the HW)
    for b in brokers:
        b.stop()
