"""Test jobs of real processes: this test process is rank 0 (it serves the store) and the
other ranks are subprocesses; every one is killed if the test fails or hangs."""

import os
import signal
import socket
import subprocess
import sys
import threading
import unittest
import xml.etree.ElementTree as ET

import drpc

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shutdown_and_reap(worker):
    """Shuts this process's drpc down gracefully, then expects the subprocess `worker` to
    exit 0 (killed if it does not)."""
    try:
        drpc.shutdown()
        assert worker.wait(timeout=60) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


class Job:
    """Starts `workers` ({name: argv builder}) as ranks 1.. and joins as rank 0."""

    def __init__(self, workers, name="worker0"):
        self.port = free_port()
        self.world_size = 1 + len(workers)
        self.procs = {}
        try:
            for rank, (worker, argv) in enumerate(workers.items(), start=1):
                self.procs[worker] = subprocess.Popen(argv(worker, rank, self.world_size, self.port),
                                                      start_new_session=True)
            options = drpc.RpcBackendOptions(init_method=f"tcp://127.0.0.1:{self.port}", init_timeout=60,
                                             heartbeat_interval=0.5, heartbeat_misses=10)
            drpc.init_rpc(name, rank=0, world_size=self.world_size, rpc_backend_options=options)
        except BaseException:
            self.kill()
            raise

    def kill_worker(self, name):
        proc = self.procs[name]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def kill(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=30)

    def finish(self, timeout=120):
        """Graceful shutdown of the whole job; returns the workers' exit codes."""
        # A watchdog: a hung shutdown kills the workers rather than the test's time limit.
        watchdog = threading.Timer(timeout, self.kill)
        watchdog.start()
        try:
            drpc.shutdown(graceful=True)
            return {name: proc.wait(timeout=timeout) for name, proc in self.procs.items()}
        finally:
            watchdog.cancel()
            self.kill()


def python_worker(name, rank, world_size, port):
    return [sys.executable, os.path.join(HERE, "worker.py"), name, str(rank), str(world_size), str(port)]


class _Recording(unittest.TextTestResult):
    def startTest(self, test):
        super().startTest(test)
        self.__dict__.setdefault("ids", []).append(test.id())


def main():
    """unittest.main, ending with "N passed, N failed" and writing JUnit XML where Bazel
    asks for it, so the suite counts each case."""
    runner = unittest.TextTestRunner(resultclass=_Recording, verbosity=2)
    result = unittest.main(exit=False, testRunner=runner).result
    bad = {t.id(): ("failure", text) for t, text in result.failures}
    bad.update({t.id(): ("error", text) for t, text in result.errors})
    skipped = {t.id(): reason for t, reason in result.skipped}
    xml_path = os.environ.get("XML_OUTPUT_FILE")
    if xml_path:
        # Counts on <testsuites> too: tools/test.sh reads them there.
        counts = dict(tests=str(result.testsRun), failures=str(len(result.failures)), errors=str(len(result.errors)))
        suites = ET.Element("testsuites", **counts)
        suite = ET.SubElement(suites, "testsuite", name=os.path.basename(sys.argv[0]), **counts)
        for test_id in getattr(result, "ids", []):
            classname, _, name = test_id.rpartition(".")
            case = ET.SubElement(suite, "testcase", classname=classname, name=name)
            if test_id in bad:
                kind, text = bad[test_id]
                ET.SubElement(case, kind, message=text.strip().splitlines()[-1]).text = text
            elif test_id in skipped:
                ET.SubElement(case, "skipped", message=skipped[test_id])
        ET.ElementTree(suites).write(xml_path)
    line = f"{result.testsRun - len(bad) - len(skipped)} passed, {len(bad)} failed"
    print(line + (f", {len(skipped)} skipped" if skipped else ""), flush=True)
    sys.exit(0 if result.wasSuccessful() else 1)
