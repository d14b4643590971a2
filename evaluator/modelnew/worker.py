"""The ModelNew sandbox worker: kf-sandbox-worker's protocol (evaluator/wire/protocol.h) served
by a Python process that runs a KernelBench-style candidate (a module defining ModelNew).

Started by the evaluator through Sandbox (evaluator/src/modelnew.cpp sets the interpreter,
a private filesystem view and user nobody), with the memfd and pipes of protocol.h, and
SCRATCH/spec.json written by the evaluator (task source, sizes, parameter names, mode).

Order, as in the C++ worker: trusted set-up first (torch, CUDA context, cuBLAS/cuDNN, views
of the shared tensors), then the confinement (rlimits, seccomp: no exec, no new processes, no
sockets, no file writes, no signal handlers; evaluator/wire/confine.h through
libkf_modelnew_confine.so), then OP_LOAD imports the candidate (its load_inline calls are
answered with what the confined compile step built: mn_common.py) and builds
ModelNew(*get_init_inputs()), whose parameters and buffers must have the task's names,
shapes and dtypes. Every OP_RUN points them at the slot's parameter tensors (the evaluator
writes the task's, or re-drawn ones), runs forward on the slot's inputs under no_grad and
copies the returned tensors into the output slot.

The clock: forward, `.contiguous()` of the outputs, a device-wide synchronisation, and the
copy into the output slot (memmove / cudaMemcpy, which no torch dispatch override reaches),
as an ABI kernel's clock covers its writes into the outputs; the evaluator's own clock
around the worker bounds it (docs/evaluator.md, "Times and speedup").

Named failures (rc of the call, with a "[modelnew] rc=N: reason" line on stderr):
  101 unsynchronised side stream   102 precision downgrade (fp16/bf16 output for a wider one)
  103 output count/shape/dtype     104 forward raised   105 output not a plain torch.Tensor
Probe mode (spec "probe": true, evaluator/src/modelnew.cpp): the last output slot is an
evidence buffer; after the call the worker runs forward again under a dispatch-mode op log
and (CUDA) the profiler, counts calls into load_inline functions, times forward the way
KernelBench does (CUDA events, mean of trials), and writes JSON there.
"""
import ctypes
import json
import mmap
import os
import signal
import sys
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mn_common  # noqa: E402

# --- protocol.h, mirrored
K_MAX_TENSORS, K_MAX_SLOTS = 4096, 4
FD_SHM, FD_CMD, FD_REPLY = 3, 4, 5
MAGIC = 0x4B464556414C3031
OP_LOAD, OP_RUN, OP_QUIT = 1, 2, 3
ST_OK, ST_LOAD_FAILED, ST_KERNEL_ERROR, ST_CUDA_ERROR, ST_PROTOCOL = 0, 1, 2, 3, 4
K_MARK_START, K_MARK_END, K_REPLY = 1, 2, 3
RC_SIDE_STREAM, RC_PRECISION, RC_OUTPUT, RC_RAISED, RC_TYPE = 101, 102, 103, 104, 105


class TensorDesc(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32), ("shape", ctypes.c_int64 * 8),
                ("nbytes", ctypes.c_uint64)]


class Layout(ctypes.Structure):
    _fields_ = [("magic", ctypes.c_uint64), ("total_bytes", ctypes.c_uint64), ("backend", ctypes.c_int32),
                ("n_in", ctypes.c_int32), ("n_out", ctypes.c_int32), ("n_slots", ctypes.c_int32),
                ("inp", TensorDesc * K_MAX_TENSORS), ("out", TensorDesc * K_MAX_TENSORS),
                ("off_in", (ctypes.c_uint64 * K_MAX_TENSORS) * K_MAX_SLOTS),
                ("off_out", (ctypes.c_uint64 * K_MAX_TENSORS) * K_MAX_SLOTS),
                ("device_arena", ctypes.c_int32), ("arena_bytes", ctypes.c_uint64),
                ("ipc_handle", ctypes.c_ubyte * 64), ("forbidden_syscall", ctypes.c_int32)]


class Command(ctypes.Structure):
    _fields_ = [("op", ctypes.c_uint32), ("slot", ctypes.c_uint32), ("poison", ctypes.c_uint32),
                ("flush_cache", ctypes.c_uint32), ("path", ctypes.c_char * 1024)]


class Reply(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_uint32), ("status", ctypes.c_uint32), ("rc", ctypes.c_int32),
                ("pad", ctypes.c_int32), ("elapsed_ns", ctypes.c_int64), ("presync_ns", ctypes.c_int64),
                ("after_sync_ns", ctypes.c_int64), ("msg", ctypes.c_char * 512)]


class IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]


def die(msg, code=3):
    sys.stderr.write("[modelnew worker pid=%d] fatal: %s\n" % (os.getpid(), msg))
    sys.stderr.flush()
    os._exit(code)


def log(msg):
    sys.stderr.write("[modelnew] %s\n" % msg)
    sys.stderr.flush()


def read_all(fd, n):
    buf = b""
    while len(buf) < n:
        try:
            chunk = os.read(fd, n - len(buf))
        except InterruptedError:
            continue
        if not chunk:
            return None
        buf += chunk
    return buf


def send(rep):
    data = bytes(rep)
    while data:
        try:
            w = os.write(FD_REPLY, data)
        except InterruptedError:
            continue
        data = data[w:]


def freeze():
    signal.raise_signal(signal.SIGSTOP)  # tgkill on ourselves: the only signal seccomp lets us send


def parse_args(argv):
    a = {"backend": "cpu", "scratch": "", "device": 0, "threads": 1, "cpu-seconds": 120, "address-space": 0,
         "scratch-limit": 0, "flush-bytes": 0, "drop-root": True}
    i = 0
    while i < len(argv):
        k = argv[i]
        if k == "--no-drop-root":
            a["drop-root"] = False
            i += 1
            continue
        if not k.startswith("--") or i + 1 >= len(argv) or k[2:] not in a:
            die("bad argument %s" % k, 2)
        v = argv[i + 1]
        a[k[2:]] = v if k[2:] in ("backend", "scratch") else int(v)
        i += 2
    if a["backend"] not in ("cpu", "cuda"):
        die("--backend must be cpu or cuda", 2)
    return a


JOB_DIR = "/kf/job"  # the compile step's folder in the view (modelnew.cpp kViewJob)


def count_triton_launches(state):
    """Wraps Triton's launch (kernel[grid](...)) to count launches per kernel name."""
    try:
        from triton.runtime import jit as triton_jit
    except ImportError:
        return
    orig = triton_jit.KernelInterface.__getitem__

    def getitem(self, grid):
        launch = orig(self, grid)
        fn = getattr(self, "fn", None)
        tag = "triton." + getattr(fn, "__name__", type(self).__name__)
        state["triton_launches"].setdefault(tag, 0)

        def counted(*a, **k):
            state["triton_launches"][tag] += 1
            return launch(*a, **k)
        return counted
    triton_jit.KernelInterface.__getitem__ = getitem


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    args = parse_args(sys.argv[1:])
    cuda = args["backend"] == "cuda"
    spec = mn_common.read_json(os.path.join(args["scratch"], "spec.json"))
    probe = bool(spec.get("probe"))

    import torch  # trusted set-up: everything torch loads lazily is loaded before the confinement
    import torch.nn.functional as F
    import torch.utils.cpp_extension as cpp
    import torch.utils._python_dispatch  # noqa: F401  (the probe's op log; imported unconfined: it opens sockets)
    if probe:
        import torch._dynamo  # noqa: F401  (imported lazily by the op log otherwise)
        if cuda:
            import torch.profiler  # noqa: F401
    torch.set_num_threads(max(1, args["threads"]))
    if spec.get("exact_fp32"):  # the task's own Model timed as the reference: exact fp32, as the C++ reference
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    dtypes = {0: torch.float32, 1: torch.float16, 2: torch.bfloat16, 3: torch.float64, 4: torch.int32,
              5: torch.int64, 6: torch.int16, 7: torch.int8, 8: torch.uint8, 9: torch.bool}

    size = os.fstat(FD_SHM).st_size
    mm = mmap.mmap(FD_SHM, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    L = Layout.from_buffer(mm)
    if (L.magic != MAGIC or L.total_bytes != size or not 0 <= L.n_in <= K_MAX_TENSORS
            or not 1 <= L.n_out <= K_MAX_TENSORS or not 1 <= L.n_slots <= K_MAX_SLOTS):
        die("bad layout")
    L.forbidden_syscall = -1
    host_base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    host_u8 = torch.frombuffer(mm, dtype=torch.uint8)

    torch.randn(64).half().float().bfloat16().sum().item()  # cpuinfo and the half/bf16 CPU kernels, unconfined
    dev = torch.device("cuda", args["device"]) if cuda else torch.device("cpu")
    cudart = None
    if cuda:
        try:
            torch.cuda.set_device(dev)
            torch.cuda.init()
        except Exception as e:
            die("CUDA did not start in the worker: %s [%s]" % (one_line(e), cuda_start_diagnosis()))
        a = torch.ones(64, 64, device=dev)
        (a @ a).sum().item()  # cuBLAS handle
        try:
            F.conv2d(torch.ones(1, 1, 4, 4, device=dev), torch.ones(1, 1, 3, 3, device=dev)).sum().item()  # cuDNN
        except Exception:
            pass
        torch.cuda.synchronize()
        cudart = load_cudart()
        if probe:  # CUPTI and the profiler's threads start here, unconfined, not in the probe's call
            try:
                from torch.profiler import ProfilerActivity, profile
                with profile(activities=[ProfilerActivity.CUDA]):
                    (a @ a).sum().item()
            except Exception as e:
                log("profiler warm-up: %s (the probe goes on without kernel names)" % one_line(e))

    def desc_shape(d):
        return [d.shape[i] for i in range(d.ndim)]

    def host_view(off, d):
        n = d.nbytes
        if n == 0:
            return torch.empty(desc_shape(d), dtype=dtypes[d.dtype])
        return host_u8[off:off + n].view(dtypes[d.dtype]).view(desc_shape(d))

    arena = 0
    if cuda and L.device_arena:
        ptr = ctypes.c_void_p()
        h = IpcHandle()
        ctypes.memmove(ctypes.addressof(h), ctypes.addressof(L.ipc_handle), 64)
        err = cudart.cudaIpcOpenMemHandle(ctypes.byref(ptr), h, 1)
        if err != 0:
            die("cudaIpcOpenMemHandle failed (%d)" % err)
        arena = ptr.value

    def device_view(addr, d):
        if d.nbytes == 0:
            return torch.empty(desc_shape(d), dtype=dtypes[d.dtype], device=dev)

        class CAI:
            __cuda_array_interface__ = {"shape": (int(d.nbytes),), "typestr": "|u1", "data": (addr, False),
                                        "version": 2, "strides": None}
        return torch.as_tensor(CAI(), device=dev).view(dtypes[d.dtype]).view(desc_shape(d))

    # Per slot: what the model sees (ins/outs) and where outputs go (out_addr).
    ins, outs, out_addr, host_ins, host_outs = [], [], [], [], []
    for s in range(L.n_slots):
        hi = [host_view(L.off_in[s][t], L.inp[t]) for t in range(L.n_in)]
        ho = [host_view(L.off_out[s][t], L.out[t]) for t in range(L.n_out)]
        host_ins.append(hi)
        host_outs.append(ho)
        if not cuda:
            ins.append(hi)
            outs.append(ho)
            out_addr.append([host_base + L.off_out[s][t] for t in range(L.n_out)])
        elif arena:
            ins.append([device_view(arena + L.off_in[s][t], L.inp[t]) for t in range(L.n_in)])
            outs.append([device_view(arena + L.off_out[s][t], L.out[t]) for t in range(L.n_out)])
            out_addr.append([arena + L.off_out[s][t] for t in range(L.n_out)])
        else:  # host staging: the worker's own device buffers, copied through the memfd
            ins.append([torch.empty(desc_shape(L.inp[t]), dtype=dtypes[L.inp[t].dtype], device=dev)
                        for t in range(L.n_in)])
            outs.append([torch.empty(desc_shape(L.out[t]), dtype=dtypes[L.out[t].dtype], device=dev)
                         for t in range(L.n_out)])
            out_addr.append([o.data_ptr() for o in outs[-1]])
    n_task_out = L.n_out - 1 if probe else L.n_out

    # The candidate's load_inline calls are answered from the compile step's builds.
    state = {"job": None, "manifest": {}, "ext_calls": {}, "ext_loaded": [], "triton_launches": {}}

    def load_inline(*a, **k):
        kw = mn_common.normalise_inline_args(a, k)
        key = mn_common.inline_key(kw)
        ent = state["manifest"].get(key)
        if ent is None:
            raise RuntimeError("load_inline(name=%r) with arguments the compile step did not see: call it at "
                               "module level or in ModelNew.__init__ with the same arguments" % kw.get("name"))
        import importlib.machinery
        import importlib.util
        path = os.path.join(state["job"], ent["so"])
        if not kw.get("is_python_module", True):
            torch.ops.load_library(path)
            return path
        loader = importlib.machinery.ExtensionFileLoader(ent["name"], path)
        sp = importlib.util.spec_from_file_location(ent["name"], path, loader=loader)
        mod = importlib.util.module_from_spec(sp)
        loader.exec_module(mod)
        state["ext_loaded"].append(ent["name"])
        return counted(mod, ent["name"])

    def counted(mod, name):
        # The module with every function wrapped by a call counter (the "custom code ran" evidence).
        class Counted:
            pass
        c = Counted()
        for attr in dir(mod):
            fn = getattr(mod, attr)
            if attr.startswith("__") or not callable(fn):
                setattr(c, attr, fn)
                continue
            tag = name + "." + attr
            state["ext_calls"].setdefault(tag, 0)

            def wrap(*a, _fn=fn, _tag=tag, **k):
                state["ext_calls"][_tag] += 1
                return _fn(*a, **k)
            setattr(c, attr, wrap)
        return c

    def refuse_load(*a, **k):
        raise RuntimeError("torch.utils.cpp_extension.load (source files) is not supported: use load_inline")
    cpp.load_inline = load_inline
    cpp.load = refuse_load

    # Triton (KernelBench's triton backend): imported before the confinement, with every
    # kernel launch counted (the "custom code ran" evidence for Triton kernels). On the CPU
    # backend its kernels run in Triton's interpreter (TRITON_INTERPRET=1, set by the
    # evaluator); CUDA candidates with Triton are refused at the compile step.
    try:
        with open(os.path.join(JOB_DIR, "candidate.py"), encoding="utf-8", errors="replace") as f:
            uses_triton = "triton" in f.read()
    except OSError:
        uses_triton = False
    if uses_triton:
        count_triton_launches(state)

    # glibc's signal set-up at the first thread, before seccomp forbids rt_sigaction.
    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()
    shim = ctypes.CDLL(os.environ["KF_MN_CONFINE_LIB"])
    shim.kf_mn_install_sigsys(ctypes.c_void_p(ctypes.addressof(L) + Layout.forbidden_syscall.offset))
    shim.kf_mn_confine.restype = ctypes.c_char_p
    err = shim.kf_mn_confine(ctypes.c_int(0 if cuda else 1), ctypes.c_long(args["cpu-seconds"]),
                             ctypes.c_ulonglong(args["address-space"]), ctypes.c_int(1 if args["drop-root"] else 0))
    if err:
        die("confinement failed: " + err.decode())

    # Bound here, before the candidate's module exists: rebinding torch.cuda.synchronize,
    # time.monotonic_ns or ctypes.memmove in its module does not change what the clock and
    # the copy use.
    memmove = ctypes.memmove
    now = time.monotonic_ns
    cuda_memcpy = cudart.cudaMemcpy if cuda else None
    cuda_sync = cudart.cudaDeviceSynchronize if cuda else None

    def cuda_error():
        # A failed device sync, or an error left by an earlier launch: its name, else "".
        e = cuda_sync() or cudart.cudaGetLastError()
        if not e:
            return ""
        return "%s (%s)" % (cudart.cudaGetErrorName(e).decode(), cudart.cudaGetErrorString(e).decode())
    current_stream = torch.cuda.current_stream if cuda else None
    no_grad = torch.no_grad
    model = None
    params = []
    call_no = 0
    train_buffers = []
    while True:
        raw = read_all(FD_CMD, ctypes.sizeof(Command))
        if raw is None:
            break
        cmd = Command.from_buffer_copy(raw)
        rep = Reply(kind=K_REPLY)
        if cmd.op == OP_QUIT:
            break
        if cmd.op == OP_LOAD:
            try:
                model, params, train_buffers = load_candidate(cmd.path.decode(), spec, state, dev, torch)
                warm_up(model, params, ins[0], host_ins[0], params_slot(ins[0], L.n_in - len(params)), torch, cuda)
            except BaseException as e:
                rep.status = ST_LOAD_FAILED
                rep.msg = one_line(e).encode()[:500]
                traceback.print_exc()
            send(rep)
            freeze()
            continue
        if cmd.op != OP_RUN or model is None or cmd.slot >= L.n_slots:
            rep.status = ST_PROTOCOL
            rep.msg = b"bad command"
            send(rep)
            break
        s = cmd.slot
        call_no += 1
        if cuda and not arena:
            for t in range(L.n_in):
                ins[s][t].copy_(host_ins[s][t])
            torch.cuda.synchronize()
        n_inputs = L.n_in - len(params)
        for p, v in zip(params, ins[s][n_inputs:]):
            p.data = v
        for b in train_buffers:  # train mode updates running stats in place: on a private copy
            b.data = b.data.clone()
        args_s = ins[s][:n_inputs]

        ps0 = now()
        if cuda:
            cuda_sync()
        mark = Reply(kind=K_MARK_START, presync_ns=now() - ps0)
        send(mark)
        freeze()  # freeze 0

        rc, why, side_ns = 0, "", 0
        t0 = now()
        try:
            with no_grad():
                res = model(*args_s)
                got = list(res) if isinstance(res, (tuple, list)) else [res]
                rc, why = check_outputs(got, L, n_task_out, dtypes, dev, torch)
                if probe and rc in (RC_PRECISION, RC_OUTPUT) and len(got) == n_task_out:
                    # KernelBench's view compares values whatever the dtype: convert, and the
                    # verdict of our protocol (the first sandbox run) has named the downgrade.
                    got = [g.to(dtypes[L.out[i].dtype]) if isinstance(g, torch.Tensor) else g
                           for i, g in enumerate(got)]
                    rc, why = check_outputs(got, L, n_task_out, dtypes, dev, torch)
                if rc == 0:
                    got = [g.contiguous() for g in got]
            if cuda:
                current_stream().synchronize()
                tc = now()
                cuda_sync()
                side_ns = now() - tc
        except BaseException as e:
            rc, why = RC_RAISED, "forward raised " + one_line(e)
            traceback.print_exc()
            if cuda:
                cuda_sync()
        t_fwd = now()
        if cuda:
            cerr = cuda_error()
            if cerr:  # the context is unusable: say so, as kf-sandbox-worker does, and exit
                mark = Reply(kind=K_MARK_END, status=ST_CUDA_ERROR, rc=rc, elapsed_ns=t_fwd - t0)
                mark.msg = ("CUDA error after forward: %s%s" % (cerr, "" if rc == 0 else " (" + why + ")")).encode()[:500]
                send(mark)
                os._exit(4)
        if rc == 0 and cuda and not probe and side_ns > max(100_000, (t_fwd - t0) // 20):
            rc = RC_SIDE_STREAM
            why = ("unsynchronised side stream: the GPU was still busy %.3f ms after forward returned and its "
                   "current stream was synchronised (work on another stream the output does not wait for)"
                   % (side_ns / 1e6))
        if rc == 0:
            for t in range(n_task_out):
                n = L.out[t].nbytes
                if n == 0:
                    continue
                if cuda:
                    cuda_memcpy(out_addr[s][t], got[t].data_ptr(), n, 3)  # device to device
                else:
                    memmove(out_addr[s][t], got[t].data_ptr(), n)
            if cuda:
                cuda_sync()
        t1 = now()  # the copy is in the clock, as an ABI kernel's writes into its outputs are
        if rc != 0:
            log("rc=%d: %s" % (rc, why))
        res = got = None
        mark = Reply(kind=K_MARK_END, rc=rc, elapsed_ns=t1 - t0)
        if cuda and not arena:
            for t in range(L.n_out):
                host_outs[s][t].copy_(outs[s][t])
            for t in range(L.n_in):
                host_ins[s][t].copy_(ins[s][t])
        send(mark)
        freeze()  # freeze 1: the evaluator takes the outputs at return

        as0 = time.monotonic_ns()
        if cuda:
            cerr = cuda_error()
            if cerr:
                rep.status = ST_CUDA_ERROR
                rep.msg = ("CUDA error after return (deferred work?): %s" % cerr).encode()[:500]
                send(rep)
                os._exit(4)
        rep.after_sync_ns = time.monotonic_ns() - as0
        if probe and call_no == int(spec.get("evidence_call", 1)):
            evidence = probe_evidence(model, args_s, spec, state, torch, cuda, dev)
            write_evidence(evidence, L, s, host_outs, outs, cuda)
        rep.rc = rc
        if rc != 0:
            rep.status = ST_KERNEL_ERROR
            rep.msg = why.encode()[:500]
        send(rep)
        freeze()  # freeze 2
    sys.stderr.flush()
    os._exit(0)


def typed(lib):
    lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.cudaGetErrorName.restype = ctypes.c_char_p
    lib.cudaGetErrorString.restype = ctypes.c_char_p
    return lib


def cuda_start_diagnosis():
    # What the confined view offers the driver, for the verdict's reason: the driver's own
    # cuInit result, the device nodes it can open, and who the worker is.
    parts = ["uid %d" % os.getuid()]
    try:
        rc = ctypes.CDLL("libcuda.so.1").cuInit(0)
        parts.append("cuInit %d" % rc)
    except OSError as e:
        parts.append("libcuda.so.1 not loadable: %s" % e)
    try:
        nodes = sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))
        parts.append("/dev: " + ",".join("%s%s" % (n, "" if os.access("/dev/" + n, os.R_OK | os.W_OK) else "(no rw)")
                                         for n in nodes))
    except OSError as e:
        parts.append("/dev unreadable: %s" % e)
    try:  # the driver names its threads here during cuInit
        with open("/proc/thread-self/comm", "w") as f:
            f.write("kf-worker")
        parts.append("/proc/thread-self/comm writable")
    except OSError as e:
        parts.append("/proc/thread-self/comm not writable: %s" % e.strerror)
    for f in ("/proc/driver/nvidia/version", "/sys/bus/pci/drivers/nvidia"):
        parts.append("%s %s" % (f, "ok" if os.path.exists(f) else "missing"))
    for k in ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH"):
        parts.append("%s=%s" % (k, os.environ.get(k, "")))
    return "; ".join(parts)


def load_cudart():
    # The CUDA runtime torch already loaded (its soname differs per CUDA major version).
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "libcudart.so" in os.path.basename(path):
                lib = ctypes.CDLL(path)
                return typed(lib)
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            lib = ctypes.CDLL(name)
            return typed(lib)
        except OSError:
            pass
    die("no CUDA runtime library found")


def one_line(e):
    lines = [x for x in str(e).strip().splitlines() if x.strip()]
    return "%s: %s" % (type(e).__name__, lines[-1] if lines else "")


def params_slot(slot_ins, n_inputs):
    return slot_ins[n_inputs:]


def load_candidate(path, spec, state, dev, torch):
    """OP_LOAD: the job folder of the compile step. Imports the candidate and builds
    ModelNew(*get_init_inputs()); its state must have the task's names, shapes, dtypes."""
    import importlib.util
    job = os.path.dirname(path)
    state["job"] = job
    state["manifest"] = mn_common.read_json(os.path.join(job, mn_common.MANIFEST))
    ns = mn_common.exec_task_source(spec["source"], spec.get("sizes"))
    torch.manual_seed(int(spec.get("init_seed", 0)))
    init = list(ns["get_init_inputs"]()) if "get_init_inputs" in ns else []
    sp = importlib.util.spec_from_file_location("kf_candidate", os.path.join(job, "candidate.py"))
    mod = importlib.util.module_from_spec(sp)
    sys.modules["kf_candidate"] = mod
    sp.loader.exec_module(mod)
    for k, v in (spec.get("sizes") or {}).items():  # the candidate's own copies of the size constants
        if hasattr(mod, k):
            setattr(mod, k, v)
    if not hasattr(mod, "ModelNew"):
        raise RuntimeError("the candidate defines no class ModelNew")
    with torch.device(dev):
        model = mod.ModelNew(*init)
    model = model.to(dev)
    if spec.get("mode") == "train":
        model.train()
    else:
        model.eval()
    named = list(model.named_parameters()) + list(model.named_buffers())
    want = spec["params"]
    got_names = [n for n, _ in named]
    want_names = [p["name"] for p in want]
    if got_names != want_names:
        missing = [n for n in want_names if n not in got_names]
        extra = [n for n in got_names if n not in want_names]
        raise RuntimeError("ModelNew's parameters and buffers do not match the task's Model: missing %s, "
                           "unexpected %s%s (ModelNew must hold Model's state_dict: same names, order, shapes)"
                           % (missing[:6], extra[:6], "" if missing or extra else ", order differs"))
    for (n, t), p in zip(named, want):
        if list(t.shape) != list(p["shape"]) or str(t.dtype).replace("torch.", "") != p["dtype"]:
            raise RuntimeError("ModelNew's %s is %s %s, the task's Model has %s %s" % (
                n, str(t.dtype).replace("torch.", ""), list(t.shape), p["dtype"], p["shape"]))
    tensors = [t for _, t in named]
    train_buffers = [t for _, t in model.named_buffers()] if spec.get("mode") == "train" else []
    return model, tensors, train_buffers


def warm_up(model, params, slot_ins, host_ins, slot_params, torch, cuda):
    # One untimed forward at load (thread pools, cuBLAS/cuDNN plans, lazy CUDA modules), so
    # the first checked call starts no new threads. Its result is dropped.
    for p, v in zip(params, slot_params):
        p.data = v
    n_inputs = len(slot_ins) - len(params)
    try:
        with torch.no_grad():
            model(*slot_ins[:n_inputs])
        if cuda:
            torch.cuda.synchronize()
    except BaseException as e:  # the inputs are not drawn yet (zeros): an error here is not the verdict
        log("warm-up forward on unset inputs raised %s (ignored)" % one_line(e))


def check_outputs(got, L, n_out, dtypes, dev, torch):
    if len(got) != n_out:
        return RC_OUTPUT, "forward returned %d tensors, the reference returns %d" % (len(got), n_out)
    for i, g in enumerate(got):
        if type(g) is not torch.Tensor:
            return RC_TYPE, "output %d is a %s, not a plain torch.Tensor" % (i, type(g).__name__)
        want_dt = dtypes[L.out[i].dtype]
        want_shape = [L.out[i].shape[k] for k in range(L.out[i].ndim)]
        if g.device != dev:
            return RC_TYPE, "output %d is on %s, the task runs on %s" % (i, g.device, dev)
        if g.dtype != want_dt:
            if (want_dt.is_floating_point and g.dtype.is_floating_point
                    and torch.finfo(g.dtype).bits < torch.finfo(want_dt).bits):
                return RC_PRECISION, ("precision downgrade: output %d is %s, the reference's is %s"
                                      % (i, str(g.dtype).replace("torch.", ""), str(want_dt).replace("torch.", "")))
            return RC_OUTPUT, "output %d has dtype %s, the reference's is %s" % (i, g.dtype, want_dt)
        if list(g.shape) != want_shape:
            return RC_OUTPUT, "output %d has shape %s, the reference's is %s" % (i, list(g.shape), want_shape)
    return 0, ""


def probe_evidence(model, args_s, spec, state, torch, cuda, dev):
    """What ran during forward: calls into load_inline functions, ATen ops computing in a
    narrower float type than the task's, (CUDA) kernels whose names come from the candidate's
    __global__ functions; and forward timed as KernelBench times it."""
    ev = {"ext_loaded": state["ext_loaded"], "errors": []}
    for k in state["ext_calls"]:
        state["ext_calls"][k] = 0
    for k in state["triton_launches"]:
        state["triton_launches"][k] = 0
    from torch.utils._python_dispatch import TorchDispatchMode
    narrow = {torch.float16, torch.bfloat16}
    wide = all(p in ("float32", "float64") for p in spec.get("float_dtypes", ["float32"]))
    ops, low = {}, {}

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), k=None):
            out = func(*a, **(k or {}))
            name = str(func)
            ops[name] = ops.get(name, 0) + 1
            outs = out if isinstance(out, (tuple, list)) else [out]
            for o in outs:
                if isinstance(o, torch.Tensor) and o.dtype in narrow and wide:
                    low[name + " -> " + str(o.dtype).replace("torch.", "")] = 1
            return out
    try:
        with torch.no_grad(), Log():
            model(*args_s)
        if cuda:
            torch.cuda.synchronize()
    except BaseException as e:
        ev["errors"].append("op log: " + one_line(e))
    ev["ext_calls"] = dict(state["ext_calls"])
    ev["triton_launches"] = dict(state["triton_launches"])
    ev["aten_ops"] = dict(sorted(ops.items(), key=lambda x: -x[1])[:40])
    ev["low_precision_ops"] = sorted(low)[:20]
    if cuda:
        try:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                with torch.no_grad():
                    model(*args_s)
                torch.cuda.synchronize()
            kernels = {}
            for e in prof.events():
                if str(getattr(e, "device_type", "")).endswith("CUDA") and e.name:
                    kernels[e.name] = kernels.get(e.name, 0) + 1
            ev["cuda_kernels"] = dict(sorted(kernels.items(), key=lambda x: -x[1])[:60])
        except BaseException as e:
            ev["errors"].append("profiler: " + one_line(e))
    # KernelBench's timing: warm-up, then per trial forward bracketed by CUDA events on the
    # current stream, a device synchronisation, the mean (CPU: perf_counter).
    trials = int(spec.get("kb_trials", 100))
    times = []
    try:
        with torch.no_grad():
            for _ in range(3):
                model(*args_s)
            if cuda:
                torch.cuda.synchronize()
            for _ in range(trials):
                if cuda:
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    model(*args_s)
                    b.record()
                    torch.cuda.synchronize()
                    times.append(a.elapsed_time(b))
                else:
                    t0 = time.perf_counter()
                    model(*args_s)
                    times.append((time.perf_counter() - t0) * 1e3)
        n = len(times)
        mean = sum(times) / n
        ev["kb_time"] = {"trials": n, "mean_ms": mean,
                         "std_ms": (sum((x - mean) ** 2 for x in times) / max(1, n - 1)) ** 0.5}
    except BaseException as e:
        ev["errors"].append("kernelbench timing: " + one_line(e))
    return ev


def write_evidence(ev, L, s, host_outs, outs, cuda):
    data = json.dumps(ev).encode()
    t = L.n_out - 1
    cap = L.out[t].nbytes
    if len(data) > cap:
        data = json.dumps({"errors": ["evidence larger than %d bytes" % cap]}).encode()
    import torch
    buf = torch.zeros(cap, dtype=torch.uint8)
    buf[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    if cuda:
        outs[s][t].view(torch.uint8).view(-1).copy_(buf.to(outs[s][t].device))
        if host_outs[s][t].data_ptr() != outs[s][t].data_ptr():
            host_outs[s][t].view(torch.uint8).view(-1).copy_(buf)
        torch.cuda.synchronize()
    else:
        host_outs[s][t].view(torch.uint8).view(-1).copy_(buf)


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException as exc:
        # The cause goes into the verdict's reason (the Sandbox quotes the "fatal:" line):
        # the exception, and where in this file it was raised.
        traceback.print_exc()
        tb = traceback.extract_tb(exc.__traceback__)
        here = [f for f in tb if f.filename == os.path.abspath(__file__)]
        at = " (worker.py line %d, in %s)" % (here[-1].lineno, here[-1].name) if here else ""
        die("worker error: %s%s" % (one_line(exc), at))
