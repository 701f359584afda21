"""The agent's notices: the board that carries them (bounded, carried then dropped, thread-safe)
and their wire form (bounded, checked, unknown kinds dropped)."""

from __future__ import annotations

import threading

import pytest

from heartbeat import (
    EventKind,
    MalformedMessageError,
    ManualClock,
    Notice,
    NoticeBoard,
    Payload,
    WorkProgress,
)
from heartbeat.payload import MAX_NOTICE_DETAIL_CHARS, MAX_NOTICES, NOTICE_KINDS, collect_payload
from heartbeat.wire.codec import payload_from_proto, payload_to_proto
from heartbeat.wire.proto import heartbeat_pb2 as pb

KIND = "SHUFFLE_CORRUPT"


def test_every_notice_kind_is_an_event_kind() -> None:
    assert sorted(NOTICE_KINDS) == ["SHUFFLE_CORRUPT"]
    for kind in NOTICE_KINDS:
        assert EventKind(kind).name == kind


def test_a_notice_rides_in_k_payloads_and_t_seconds_then_is_dropped() -> None:
    clock = ManualClock()
    board = NoticeBoard(clock, carry_payloads=3, carry_s=10.0)
    clock.jump(500.0)  # no payload asked for yet: the carrying has not started
    notice = board.add(KIND, "shuffle 3, map partition 5, file /x/m5.arrows: checksum mismatch")
    assert board() == [notice]
    assert board() == [notice]
    clock.jump(20.0)  # long enough, but only two payloads so far
    assert board() == [notice]
    assert board() == [], "three payloads and 20 s: dropped"
    assert board.pending() == 0


def test_many_payloads_in_a_short_time_do_not_use_a_notice_up() -> None:
    clock = ManualClock()
    board = NoticeBoard(clock, carry_payloads=3, carry_s=10.0)
    notice = board.add(KIND, "damaged")
    for _ in range(50):  # a fast heartbeat interval
        assert board() == [notice]
        clock.jump(0.1)
    clock.jump(5.0)
    assert board() == [notice], "10 s since its first payload have not passed"
    clock.jump(0.1)
    assert board() == []


def test_the_board_is_bounded_and_drops_the_oldest() -> None:
    board = NoticeBoard(ManualClock(), max_pending=3)
    added = [board.add(KIND, f"finding {i}") for i in range(5)]
    assert board() == added[2:]
    assert board.dropped == 2
    with pytest.raises(ValueError):
        NoticeBoard(max_pending=MAX_NOTICES + 1)  # a payload could not carry them all


def test_an_unknown_kind_is_refused_and_a_detail_is_one_bounded_line() -> None:
    board = NoticeBoard(ManualClock())
    for kind in ("REGISTERED", "shuffle_corrupt", ""):
        with pytest.raises(ValueError, match="no notice kind"):
            board.add(kind, "made up")
    assert board() == []
    notice = board.add(KIND, "file /x\ny.arrows\x1b[31m" + "z" * 5000)
    assert notice.detail.isprintable() and "\\n" in notice.detail
    assert len(notice.detail) <= MAX_NOTICE_DETAIL_CHARS
    assert notice.detail.endswith("...(cut)")


def test_concurrent_adds_are_all_numbered_and_bounded() -> None:
    board = NoticeBoard(ManualClock(), max_pending=MAX_NOTICES)
    threads, per_thread = 8, 500
    start = threading.Barrier(threads)
    ids: list[list[str]] = [[] for _ in range(threads)]

    def add(slot: int) -> None:
        start.wait()
        for i in range(per_thread):
            ids[slot].append(board.add(KIND, f"t{slot} {i}").id)

    workers = [threading.Thread(target=add, args=(slot,)) for slot in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=30)
    every = [i for slot in ids for i in slot]
    assert len(every) == len(set(every)) == threads * per_thread
    assert board.pending() == MAX_NOTICES
    assert board.dropped == threads * per_thread - MAX_NOTICES
    numbers = sorted(int(i.rsplit("-", 1)[1]) for i in every)
    assert numbers == list(range(1, threads * per_thread + 1))
    kept = [int(n.id.rsplit("-", 1)[1]) for n in board()]
    assert kept == sorted(kept) and kept[-1] == threads * per_thread, "the newest are kept, in order"


def test_a_restarted_agents_board_numbers_anew_with_other_ids() -> None:
    first, second = NoticeBoard(ManualClock()), NoticeBoard(ManualClock())
    assert first.add(KIND, "a").id != second.add(KIND, "a").id


def test_the_board_is_a_payload_provider_beside_work() -> None:
    board = NoticeBoard(ManualClock())
    notice = board.add(KIND, "damaged")
    work = WorkProgress("42", "stage 1.0 partition 0 attempt 0 (task 42)", 1.0, 0.5)
    payload = collect_payload([lambda: [work], board, lambda: {"slots_total": 2}])
    assert payload == Payload(slots_total=2, work=(work,), notices=(notice,))


def test_notices_round_trip_on_the_wire() -> None:
    notices = (
        Notice("ab12cd34-1", KIND, "shuffle 3, file /x/m5.arrows: bad"),
        Notice("ab12cd34-2", KIND, ""),
    )
    payload = Payload(slots_total=1, notices=notices)
    wire = pb.Payload.FromString(payload_to_proto(payload).SerializeToString())
    assert payload_from_proto(wire) == payload


def test_a_notice_of_an_unknown_kind_is_dropped_and_the_heartbeat_kept() -> None:
    message = payload_to_proto(Payload(slots_total=4, notices=(Notice("a-1", KIND, "kept"),)))
    message.notices.append(pb.Notice(id="a-2", kind="REGISTERED", detail="an invented lifecycle event"))
    message.notices.append(pb.Notice(id="a-3", kind="SOMETHING_NEWER", detail="a newer agent's kind"))
    got = payload_from_proto(message)
    assert got.slots_total == 4
    assert got.notices == (Notice("a-1", KIND, "kept"),)


@pytest.mark.parametrize(
    "notice",
    [
        pb.Notice(id="", kind=KIND, detail="no id"),
        pb.Notice(id="a-1", kind=KIND, detail="two\nlines"),
        pb.Notice(id="a-1", kind=KIND, detail="x" * (MAX_NOTICE_DETAIL_CHARS + 1)),
        pb.Notice(id="a\n1", kind=KIND, detail="bad id"),
        pb.Notice(id="a-1", kind="SHUFFLE_CORRUPT\n", detail="bad kind"),
    ],
)
def test_a_malformed_notice_is_refused(notice: pb.Notice) -> None:
    message = pb.Payload(notices=[notice])
    with pytest.raises(MalformedMessageError):
        payload_from_proto(message)


def test_at_most_max_notices_travel_and_more_are_refused() -> None:
    many = tuple(Notice(f"a-{i}", KIND, "d") for i in range(MAX_NOTICES + 5))
    assert len(payload_to_proto(Payload(notices=many)).notices) == MAX_NOTICES
    message = pb.Payload(notices=[pb.Notice(id=n.id, kind=n.kind, detail=n.detail) for n in many])
    with pytest.raises(MalformedMessageError, match="notices"):
        payload_from_proto(message)
