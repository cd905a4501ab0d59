"""One session shared by Python threads: calls are serialized for libferry (its Session has
one owner), tensors dropped on any thread are released, and every result is right."""

import threading

import numpy as np


def test_threads_share_a_session(client, daemon):
    n_threads, rounds, n = 4, 25, 512
    errors = []
    with client.session() as s:
        def worker(k):
            try:
                for r in range(rounds):
                    value = float(k * 1000 + r)
                    t = s.tensor(n, "float32")
                    s.fill(t, value)
                    got = s.download(t)
                    if not (got == value).all():
                        errors.append((k, r, got[:4]))
                    buf = s.pinned_buffer(t.nbytes)
                    s.scale(t, 2.0, t)
                    t, buf = s.download_pending(t, buf).wait()
                    if not (buf.numpy(np.float32, (n,)) == 2 * value).all():
                        errors.append((k, r, "pending"))
                    del t, buf  # dropped on this thread; released at a later call
            except Exception as e:  # reported below
                errors.append((k, repr(e)))

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
        assert not errors, errors[:5]
        s.synchronize()  # the last releases go with it
        st = daemon.wait_for(lambda st: st["live_tensors"] == 0)
        assert st["live_tensors"] == 0
    assert s.stats.tensors_created == n_threads * rounds
    assert s.stats.failed_submits == 0
