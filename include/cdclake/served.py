"""A long-lived load driver: one Spark application that runs the load job's batches for
many load tasks, so a batch pays no JVM start, no Python worker start and no cold JIT.

`cdclake serve` starts it. A pipeline with `spark.served: http://host:port` has its load
tasks (scheduled and backfill) send their plans there (`submit`) instead of starting
spark-submit for each batch. The batch runs the same `run_batch` and commits the same way,
so exactly-once does not depend on the driver: a batch cut short (the driver stopped, the
task killed) is planned again from the offsets its tables committed.

The protocol is HTTP on one port:

- `POST /load` with a JSON body `{"pipeline": <YAML path on the driver's machine>,
  "plans": [<batch plan>, ...]}` answers with JSON lines: `{"log": text}` as the job logs,
  `{"batch": {"batch_id", "tables"}}` when a plan's tables are committed, and last either
  `{"done": true}` or `{"error": text, "type": name}`. A pipeline's batches run one at a
  time, in the order they came (a task waits for the batch before it); different
  pipelines' batches run at the same time (up to `--max-batches`, 4 by default; the
  others wait their turn), sharing the application's cores. Each
  request's Spark jobs are in a job group of their own, and its log lines are its own
  threads'. When a task goes away (timeout, kill) its connection closes, and the driver
  cancels its batch's Spark jobs (its job group's) only.
- `GET /health`: whether the driver is up (`status` "dead" once its Spark application
  died: `serve` then exits with status 3), busy, how many batches run now and how many it
  ran, and how many cached datasets the batches left (none, unless one leaks).

Secrets come from the driver's own environment, as a spark-submit driver's do: the
pipeline file names them, the request never carries them, and neither do the log lines.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import select
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cdclake.exceptions import CANCEL, CdclakeError, ConfigError

log = logging.getLogger(__name__)
# the requests a driver answers (not streamed to a batch's task: they are not its lines)
access_log = logging.getLogger(f"{__name__}.http")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
# a load request's body: a path and plans (a backfill's plans are ~200 bytes a range)
MAX_REQUEST_BYTES = 64 << 20
# how often a running batch checks that its task is still connected
WATCH_S = 0.5
# batches (of different pipelines) a driver runs at once by default (`--max-batches`)
MAX_BATCHES = 4
# the load request a thread works for (set in the request's thread, carried to the
# batch's threads by `job.carried`): its log lines go to that request's task only
_REQUEST: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "cdclake_served_request", default=None
)


class LoadServer:
    """Runs batches of load plans on one Spark application: a pipeline's batches one at
    a time, different pipelines' at the same time.

    The first pipeline served starts the application with its settings (`build_session`,
    without a batch size: both JIT compilers, since the driver lives long). Each pipeline
    then has a session of its own (`newSession`: its own SQL settings and catalogs, the
    shared cache and executors), kept for its next batches. A pipeline whose settings
    need another application (jars, memory) is refused, naming them; the driver's
    master (`master`, else the first pipeline's) runs them all."""

    def __init__(self, master: str | None = None, source: Callable | None = None,
                 max_batches: int = MAX_BATCHES) -> None:  # fmt: skip
        if max_batches < 1:
            raise ConfigError(f"--max-batches must be at least 1, not {max_batches}")
        self.master = master
        # at most this many requests' batches at once (each caches its rows in the one
        # driver's memory); the others wait their turn
        self._slots = threading.BoundedSemaphore(max_batches)
        self.max_batches = max_batches
        # plan -> the `RawSource` to read it from, or None for Kafka (the benchmark's
        # recording)
        self.source = source
        self._lock = threading.Lock()  # the application, the sessions, the counts
        self._pipelines: dict[str, threading.Lock] = {}  # a pipeline's batches in turn
        self._spark = None
        self._conf: dict[str, str] = {}
        # pipeline name -> (its settings as `session` compares them, its session)
        self._sessions: dict[str, tuple[str, object]] = {}
        self.batches = 0
        self.running = 0  # requests whose batches run now
        self.started = time.time()
        # set when the Spark application died under the driver: no batch can run on it
        # any more, and `serve` exits so that its supervisor starts a fresh driver
        self.dead = threading.Event()

    @property
    def busy(self) -> bool:
        return self.running > 0

    def health(self) -> dict:
        cached = None  # what the batches left cached (none, unless one leaks)
        if self._spark is not None and not self.busy and self._alive():
            cached = self._spark.sparkContext._jsc.getPersistentRDDs().size()
        return {"status": "dead" if self.dead.is_set() else "ok", "pid": os.getpid(),
                "busy": self.busy, "running": self.running,
                "max_batches": self.max_batches, "batches": self.batches,
                "spark": self._spark is not None, "cached_rdds": cached,
                "uptime_s": round(time.time() - self.started, 1)}  # fmt: skip

    def session(self, pipeline):
        from cdclake.jvm import DRIVER_OPTIONS
        from cdclake.spark import build_session, spark_conf

        conf = spark_conf(pipeline)
        conf.pop(DRIVER_OPTIONS, None)  # chosen per batch by spark-submit, fixed here
        key = json.dumps(sorted(conf.items()))
        with self._lock:
            if self._spark is None:
                self._spark = build_session(pipeline, self.master or pipeline.spark.master)
                self._conf = conf
                self._sessions[pipeline.name] = (key, self._spark)
                return self._spark
            known_key, known = self._sessions.get(pipeline.name, (None, None))
            if known_key == key:
                return known
            spark = self._spark.newSession()
            fixed = []
            for k, v in conf.items():
                if self._conf.get(k) == v:
                    continue
                try:
                    spark.conf.set(k, v)
                except Exception:  # a setting of the application, not of a session
                    fixed.append(k)
            fixed += [k for k in self._conf if k not in conf and not _session_setting(k)]
            if fixed:
                raise ConfigError(
                    f"{pipeline.path}: spark.conf: this served driver was started with other "
                    f"values of {sorted(set(fixed))}, which a session cannot change; serve "
                    "this pipeline from a driver of its own"
                )
            self._sessions[pipeline.name] = (key, spark)
            return spark

    def _alive(self) -> bool:
        """The Spark application runs (True before it is started)."""
        if self._spark is None:
            return True
        try:
            return not self._spark.sparkContext._jsc.sc().isStopped()
        except Exception:  # its JVM is gone
            return False

    def _turn(self, name: str) -> threading.Lock:
        """The lock a pipeline's batches take in turn."""
        with self._lock:
            return self._pipelines.setdefault(name, threading.Lock())

    def load(self, pipeline_path: str, plans: Sequence, out: _Lines, gone: Callable[[], bool]):
        """Run `plans` (BatchPlans) of the pipeline at `pipeline_path`, writing the log
        and results to `out`; `gone()` says the task has gone away."""
        from cdclake.config import load_pipeline

        _REQUEST.set(request := object())
        handler = _LineHandler(out, request)
        logging.getLogger("cdclake").addHandler(handler)
        try:
            try:
                pipeline = load_pipeline(pipeline_path)
            except Exception as exc:
                log.warning("batch failed: %s: %s", type(exc).__name__, exc)
                out.write({"error": str(exc), "type": type(exc).__name__})
                return
            with self._turn(pipeline.name), self._slots:
                with self._lock:
                    self.running += 1
                try:
                    self._load(pipeline, plans, out, gone)
                finally:
                    with self._lock:
                        self.running -= 1
        finally:
            logging.getLogger("cdclake").removeHandler(handler)

    def _load(self, pipeline, plans: Sequence, out: _Lines, gone: Callable[[], bool]) -> None:
        from cdclake.job import _brief, carried, run_batch

        done = threading.Event()
        cancelled = threading.Event()
        CANCEL.set(cancelled)  # a wait outside Spark jobs (the driver's read) sees it too
        group = f"cdclake-served-{uuid.uuid4().hex[:12]}"
        spark = None
        try:
            if self.dead.is_set() or not self._alive():
                raise CdclakeError("the driver's Spark application is gone")
            if gone():  # it waited for the batch before it, then went away
                cancelled.set()
                raise CdclakeError("cancelled")
            spark = self.session(pipeline)
            # the request's jobs, in this thread and those of its batch, are cancelled
            # together and alone
            spark.sparkContext.setJobGroup(group, f"{pipeline.name}: {len(plans)} batch(es)")
            watch = threading.Thread(target=carried(_watch), name="cdclake-served-watch",
                                     args=(spark, group, gone, out, done, cancelled),
                                     daemon=True)  # fmt: skip
            watch.start()
            for plan in plans:
                if cancelled.is_set():
                    break
                log.info("batch %s: %d records of %d ranges", plan.batch_id, plan.total,
                         len(plan.ranges))  # fmt: skip
                read = self.source(plan) if self.source else None
                results = run_batch(spark, pipeline, plan, read=read)
                with self._lock:
                    self.batches += 1
                out.write({"batch": {"batch_id": plan.batch_id,
                                     "tables": [r.to_dict() for r in results]}})  # fmt: skip
            if cancelled.is_set():
                raise CdclakeError("cancelled")
            out.write({"done": True})
        except Exception as exc:
            error = exc
            if cancelled.is_set():  # the cancelled jobs' errors say less than this
                log.info("the cancelled batch stopped at: %s: %s", type(exc).__name__,
                         _brief(exc))  # fmt: skip
                error = CdclakeError("the load task went away; its Spark jobs were cancelled")
            if not self._alive():
                self.dead.set()
                error = CdclakeError(
                    "the driver's Spark application is gone (its JVM died or was "
                    f"stopped: {type(exc).__name__}); the driver stops so that its "
                    "supervisor starts a fresh one, and the next run loads the batch"
                )
            log.warning("batch failed: %s: %s", type(error).__name__, error)
            out.write({"error": str(error), "type": type(error).__name__})
        finally:
            done.set()
            if spark is not None and self._alive():
                for name in ("spark.jobGroup.id", "spark.job.description"):
                    spark.sparkContext.setLocalProperty(name, None)


def _session_setting(key: str) -> bool:
    return key.startswith("spark.sql.") and not key.startswith("spark.sql.extensions")


def _watch(spark, group: str, gone: Callable[[], bool], out: _Lines, done: threading.Event,
           cancelled: threading.Event) -> None:  # fmt: skip
    """Cancel the batch's Spark jobs (its request's job `group`) once its task has gone
    away (and any it starts after), until the batch ends."""
    while not done.wait(WATCH_S):
        if cancelled.is_set() or out.broken or gone():
            if not cancelled.is_set():
                log.warning("the load task went away; cancelling the batch's Spark jobs")
                cancelled.set()
            spark.sparkContext.cancelJobGroup(group)


class _Lines:
    """JSON lines to a response, from any thread; a write to a closed connection marks it
    broken instead of raising."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self.broken = False

    def write(self, message: dict) -> None:
        data = (json.dumps(message, default=str) + "\n").encode()
        with self._lock:
            if self.broken:
                return
            try:
                self._stream.write(data)
                self._stream.flush()
            except OSError:
                self.broken = True


class _LineHandler(logging.Handler):
    """The log lines of one load request's threads (`_REQUEST`), to its task."""

    def __init__(self, out: _Lines, request: object) -> None:
        super().__init__(logging.INFO)
        self.out, self.request = out, request
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == access_log.name or _REQUEST.get() is not self.request:
            return
        try:
            self.out.write({"log": self.format(record)})
        except Exception:  # pragma: no cover - logging must not fail the batch
            self.handleError(record)


def _closed(conn: socket.socket) -> bool:
    """The peer closed `conn` (the request body was read whole, so anything readable is
    its end)."""
    try:
        readable, _, _ = select.select([conn], [], [], 0)
        return bool(readable) and conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:  # noqa: N802
        if self.path.rstrip("/") == "/health":
            self._json(200, self.server.load_server.health())
        else:
            self._json(404, {"error": f"no such path {self.path!r}; try /health or /load"})

    def do_POST(self) -> None:  # noqa: N802
        from cdclake.offsets import BatchPlan

        if self.path.rstrip("/") != "/load":
            self._json(404, {"error": f"no such path {self.path!r}; POST /load"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 <= length <= MAX_REQUEST_BYTES:
                raise ValueError(f"a body of {length} bytes (at most {MAX_REQUEST_BYTES})")
            body = json.loads(self.rfile.read(length) or b"null")
            if not isinstance(body, dict) or not isinstance(body.get("pipeline"), str):
                raise ValueError('the body must be {"pipeline": <path>, "plans": [...]}')
            plans = [BatchPlan.from_dict(p) for p in body.get("plans") or []]
        except (ValueError, KeyError, TypeError, ConfigError) as exc:
            self._json(400, {"error": f"bad load request: {exc}", "type": "ValueError"})
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.end_headers()
        out = _Lines(self.wfile)
        self.server.load_server.load(body["pipeline"], plans, out,
                                     lambda: _closed(self.connection))  # fmt: skip

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args) -> None:  # noqa: A002
        access_log.info("%s %s", self.address_string(), format % args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    load_server: LoadServer


def make_server(load_server: LoadServer, host: str = DEFAULT_HOST,
                port: int = DEFAULT_PORT) -> _Server:  # fmt: skip
    server = _Server((host, port), _Handler)
    server.load_server = load_server
    return server


def serve(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, master: str | None = None,
          source: Callable | None = None, max_batches: int = MAX_BATCHES) -> int:  # fmt: skip
    """Serve load requests until interrupted or stopped (`cdclake serve`; `source` and
    `max_batches` as `LoadServer`'s): 0, or 3 when the Spark application died under it."""
    import signal

    load_server = LoadServer(master, source, max_batches)
    server = make_server(load_server, host, port)

    def stop_when_dead() -> None:
        load_server.dead.wait()
        log.error("the Spark application is gone; stopping this driver")
        server.shutdown()

    threading.Thread(target=stop_when_dead, name="cdclake-served-dead", daemon=True).start()
    # stop serving on SIGTERM as on ^C; a batch still running fails with the application,
    # and its task's retry plans it again from what its tables committed
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    log.info("serving loads on http://%s:%d (POST /load, GET /health)", host,
             server.server_address[1])  # fmt: skip
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        spark = load_server._spark
        if spark is not None and not load_server.dead.is_set():
            spark.stop()
    return 3 if load_server.dead.is_set() else 0


def health(url: str, timeout_s: float = 5) -> dict:
    """The served driver's `GET /health` answer; OSError when it cannot be reached."""
    with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout_s) as answer:
        return json.loads(answer.read())


def submit(url: str, pipeline_path: str, plans: Sequence[dict],
           on_log: Callable[[str], None] | None = None) -> list[dict]:  # fmt: skip
    """Send `plans` (batch plans as dicts) of the pipeline to the served driver at `url`
    and wait for them; the driver's log lines go to `on_log` (this module's log by
    default). Returns each batch's `{"batch_id", "tables"}`; raises CdclakeError when the
    driver cannot be reached, a batch fails, or the driver stops before the end."""
    on_log = on_log or (lambda line: log.info("%s", line))
    body = json.dumps({"pipeline": pipeline_path, "plans": list(plans)}).encode()
    request = urllib.request.Request(f"{url.rstrip('/')}/load", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        response = urllib.request.urlopen(request)  # no timeout: a batch logs rarely
    except urllib.error.HTTPError as exc:
        raise CdclakeError(f"served driver {url}: {exc.code}: {_error_text(exc)}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CdclakeError(f"served driver {url} cannot be reached ({reason}); start it with "
                           "`cdclake serve`, or remove spark.served from the pipeline to "
                           "load with spark-submit") from None  # fmt: skip
    batches: list[dict] = []
    with response:
        for line in response:
            message = json.loads(line)
            if "log" in message:
                on_log(message["log"])
            elif "batch" in message:
                batches.append(message["batch"])
            elif "error" in message:
                raise CdclakeError(f"served driver {url}: {message.get('type')}: "
                                   f"{message['error']}")  # fmt: skip
            elif message.get("done"):
                return batches
    raise CdclakeError(
        f"served driver {url} stopped before the batch ended ({len(batches)} of {len(plans)} "
        "batches committed); the next run loads the rest"
    )


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        return json.loads(exc.read()).get("error", "")
    except (ValueError, OSError):
        return exc.reason
