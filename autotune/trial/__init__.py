"""One trial: a typed Job in, a typed JobResult out; the build -> gate -> benchmark run, and the entry point of the
child process that runs it isolated."""
