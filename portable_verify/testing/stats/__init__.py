"""Statistics behind the losslessness checks: chi-square and power, exact laws, toy decoding,
the scenario tables and the negative-control samplers."""
