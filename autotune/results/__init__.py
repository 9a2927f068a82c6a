"""What a study found: the Pareto front (a leaf), its tables, recipes exported from it, dashboard notes, the data
of the HTML report and the report itself, and the dashboard server."""
