"""The evaluation report, under the import path it had before the `trl_rm_env.evaluation` package: the code is in
`trl_rm_env.evaluation.report`."""

from .evaluation.report import PLOTS, format_report_markdown, number, percent, write_report  # noqa: F401
