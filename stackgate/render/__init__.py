"""Rendering: the console (ui, the only module that imports rich), the machine-readable reports
(report: JUnit; summaries: Markdown, Prometheus, the gate's JUnit) and the HTML history page
(html). Renderers only read results and runs."""
