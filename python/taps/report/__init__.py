"""What a plan looks like to a person: rich tables and JSON records of plans, searches and
redistributions (:mod:`.tables`), and figures (:mod:`.plot`, matplotlib)."""
