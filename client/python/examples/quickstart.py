"""The README's Python example: connect, compute on the GPU, move data without a copy."""
import sys

import numpy as np

import ferry

target = sys.argv[1] if len(sys.argv) > 1 else "unix:/run/ferry/ferryd-0.sock"
client = ferry.Client.connect(target)
with client.session() as s:  # closed at the end of the block
    a, b, total = s.tensor(1 << 20), s.tensor(1 << 20), s.tensor(1)  # float32
    s.upload(a, np.full(1 << 20, 1.5, np.float32))  # blocking upload
    s.scale(a, 2.0, b)  # recorded, not sent yet
    s.axpy(1.0, a, b)  # b = 2a + a
    s.sum(b, total)
    print(f"backend {s.backend}: sum = {s.download(total)[0]:.1f}")  # one submit, then the read
    buf = s.pinned_buffer(b.nbytes)  # memory of the daemon's shared slab
    b, buf = s.download_pending(b, buf).wait()  # a DMA into it; wait() gives both back
    view = buf.numpy(np.float32)  # a numpy view of the slab: no copy
    print("every element 4.5:", bool((view == 4.5).all()))
print(s.stats)
