"""Recording: the launch generator, the run plan and loop, the latency suite and ``attach``. Each
fills a :class:`pcietrace.session.Session`; nothing here analyses or renders."""
