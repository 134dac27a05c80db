"""Presentation: one :class:`~pcietrace.report.renderers.Renderer` class per output format behind one registry
(:mod:`pcietrace.report.renderers`), the console split per command (:mod:`pcietrace.report.console`), the
sentences of the analysis' notes (:mod:`pcietrace.report.notes`). Renderers format; they never compute."""
