"""Monthly chargeback reports (`gpu-ledger report`).

model.py reads priced charges into report tables; tidy.py flattens them into the one table
that csvout.py and parquetout.py write; markdown.py, html.py (with charts.py) and terminal.py
render them for people; writer.py replaces the files all at once; cli.py ties it together.
"""
