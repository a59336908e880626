"""Monthly chargeback reports (`gpu-ledger report`).

model.py holds what a report says, as types; builder.py reads the ledger into one Report (its
queries are metering/sql/report.sql; waste.py adds the recommendations) and writes it; tidy.py
flattens it into the one table that csvout.py and parquetout.py write; markdown.py, html.py
(with charts.py) and terminal.py render it for people; writer.py replaces the files all at
once; cli.py is the `gpu-ledger report` command.
"""
