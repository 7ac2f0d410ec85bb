"""Per-step wall, CPU and page faults of a training step, optionally with glibc's mmap/trim thresholds up."""
import ctypes
import os
import resource
import statistics
import sys
import time

if os.environ.get("PROBE_MALLOPT") == "1":
    libc = ctypes.CDLL("libc.so.6")
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    assert libc.mallopt(M_MMAP_THRESHOLD, 1 << 30) == 1 and libc.mallopt(M_TRIM_THRESHOLD, 1 << 62) == 1
from opengem.train.config import load_run_config
from opengem.train.data import prepare_data
from opengem.train.trainer import Trainer

cfg = load_run_config("configs/small-d32.toml", [f"model.name={sys.argv[1]}"])
data = prepare_data(cfg.data, "/work/s51/benchdata", None)
with Trainer(cfg, None, data) as trainer:
    it = iter(trainer.train_loader())
    batches = [next(it).to(trainer.device) for _ in range(8)]
    for k in range(5):
        trainer.train_step(batches[k % 8])
    res = []
    for _ in range(5):
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0, c0 = time.perf_counter(), time.process_time()
        for k in range(20):
            trainer.train_step(batches[k % 8])
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        res.append(((time.perf_counter() - t0) / 20 * 1e3, (time.process_time() - c0) / 20 * 1e3,
                    (r1.ru_minflt - r0.ru_minflt) / 20, (r1.ru_stime - r0.ru_stime) / 20 * 1e3,
                    (r1.ru_nivcsw - r0.ru_nivcsw + r1.ru_nvcsw - r0.ru_nvcsw) / 20))
    med = [statistics.median(x[i] for x in res) for i in range(5)]
    B = cfg.data.batch_size
    print(f"{sys.argv[1]:6s} mallopt={os.environ.get('PROBE_MALLOPT', '0')} wall {med[0]:6.1f} ms "
          f"({B / med[0] * 1e3:5.0f} ex/s) cpu {med[1]:6.1f} ms  sys {med[3]:5.1f} ms  "
          f"minflt/step {med[2]:7.0f}  "
          f"ctxsw/step {med[4]:5.1f}  load {os.getloadavg()[0]:.2f}")
