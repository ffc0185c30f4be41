"""Runtime tracing and capture (`dif.trace.recorder`, called by backends' executors) and attribution of
trace files (`dif.trace.attribute`, read by `dif trace`), in one vocabulary (`dif.trace.vocabulary`)."""

from dif.trace.recorder import Recorder, begin, collecting

__all__ = ["Recorder", "begin", "collecting"]
