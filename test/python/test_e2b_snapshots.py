# The unmodified e2b SDK's snapshots and fork against our API (test/e2b-snapshots-python.test.ts
# starts the system and applies SNAP_TEMPLATE: a gVisor sandbox whose server on 8080 counts GETs
# in memory). What a user of E2B does: snapshot a sandbox, list and delete snapshots, start
# sandboxes from one, fork a sandbox; memory and processes come along, and each copy is its own.
import os

from e2b import Sandbox

TEMPLATE = os.environ["SNAP_TEMPLATE"]
COUNT = "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8080/').read().decode())\""


def count(sbx):
    return sbx.commands.run(COUNT).stdout.strip()


def test_snapshot_start_list_delete():
    sbx = Sandbox.create(TEMPLATE)
    try:
        token = count(sbx).split()[0]
        # A background command holding its state in memory: it comes along with the snapshot.
        sbx.commands.run("x=0; while true; do x=$((x+1)); echo $x > /tmp/ticks; sleep 0.1; done", background=True)
        info = sbx.create_snapshot(name="after-one")
        assert info.snapshot_id
        assert info.names == ["after-one"]
        assert count(sbx) == f"{token} 2", "the source runs on"

        listed = []
        paginator = Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id)
        while paginator.has_next:
            listed += paginator.next_items()
        assert [s.snapshot_id for s in listed] == [info.snapshot_id]

        copy = Sandbox.create(info.snapshot_id)
        try:
            assert copy.sandbox_id != sbx.sandbox_id
            assert count(copy) == f"{token} 2", "the copy goes on from the snapshot's memory"
            first = int(copy.commands.run("cat /tmp/ticks").stdout)
            second = int(copy.commands.run("sleep 0.5; cat /tmp/ticks").stdout)
            assert second > first, "the background loop runs on in the copy"
        finally:
            copy.kill()
        assert Sandbox.delete_snapshot(info.snapshot_id) is True
        assert Sandbox.delete_snapshot(info.snapshot_id) is False
    finally:
        sbx.kill()


def test_fork_three():
    sbx = Sandbox.create(TEMPLATE)
    try:
        token = count(sbx).split()[0]
        forks = sbx.fork(count=3, timeout=120)
        assert len(forks) == 3
        for fork in forks:
            assert isinstance(fork, Sandbox), f"a fork failed: {fork!r}"
        ids = {sbx.sandbox_id, *(f.sandbox_id for f in forks)}
        assert len(ids) == 4
        for fork in forks:
            assert count(fork) == f"{token} 2"
        fork = forks[0]
        fork.files.write("/tmp/own.txt", "fork zero")
        assert count(fork) == f"{token} 3"
        assert count(sbx) == f"{token} 2", "the source shares no memory with a fork"
        assert not sbx.files.exists("/tmp/own.txt"), "nor files"
        for f in forks:
            f.kill()
        # The fork's snapshot is gone: nothing is left to list.
        paginator = Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id)
        assert paginator.next_items() == []
    finally:
        sbx.kill()
