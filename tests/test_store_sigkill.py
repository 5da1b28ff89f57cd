"The run store survives a writer killed with SIGKILL mid-stream: every complete record reads back, the file stays appendable."
import os, signal, subprocess, sys, textwrap, time
from pathlib import Path
from labmod.lab.store import RunStore, read_jsonl

WRITER = textwrap.dedent("""
    import sys
    from labmod.lab.store import RunStore
    st = RunStore(sys.argv[1])
    i = 0
    while True:
        st.append("records", [{"i": i + k, "pad": "x" * 2000} for k in range(5)])
        i += 5
        print(i, flush=True)
""")

def test_sigkill_writer_leaves_readable_store(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    acked = 0
    deadline = time.time() + 60
    while acked < 200 and time.time() < deadline:
        acked = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL); proc.wait()
    assert acked >= 200, "writer too slow to reach 200 records"
    recs = list(read_jsonl(tmp_path / "records.jsonl"))
    ids = [r["i"] for r in recs]
    # every acknowledged batch is durable, records are in order with no gaps, at most the batch in flight is lost
    assert ids == list(range(len(ids))) and len(ids) >= acked
    st = RunStore(tmp_path)
    st.append("records", [{"i": len(ids)}])
    assert [r["i"] for r in st.read("records")] == list(range(len(ids) + 1))

def test_truncated_tail_is_repaired(tmp_path):
    st = RunStore(tmp_path)
    st.append("m", [{"a": 1}])
    with open(st.path("m"), "ab") as f: f.write(b'{"a": 2, "half')
    assert st.read("m") == [{"a": 1}]
    st.append("m", [{"a": 3}])
    assert st.read("m") == [{"a": 1}, {"a": 3}]
