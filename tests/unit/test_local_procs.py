"""The local stack signals only the processes it started: a pid file records the pid and
the process's start time, and a pid another process has taken since is left alone."""

from cdclake_local.procs import pid_alive, running, start_daemon, stop_daemon


def test_a_pid_taken_by_another_process_is_never_signalled(tmp_path):
    pidfile, logfile = tmp_path / "sleep.pid", tmp_path / "sleep.log"
    pid = start_daemon(["sleep", "60"], pidfile, logfile)
    started = pidfile.with_name("sleep.pid.started")
    recorded = started.read_text()
    assert pidfile.read_text() == str(pid)  # what older cdclake reads
    assert running(pidfile) == pid
    # the same pid, started at another time: what a pid file left by a process that died
    # looks like once the pid was given to another one
    started.write_text("1.0")
    assert running(pidfile) is None
    assert stop_daemon(pidfile) is False
    assert pid_alive(pid)
    pidfile.write_text(str(pid))
    started.write_text(recorded)
    assert stop_daemon(pidfile) is True
    assert not pid_alive(pid) and not started.exists()
