"""Private helpers every capability uses: argument checks (:mod:`.arguments`), optional
dependencies (:mod:`.extras`), resource limits known before a search runs (:mod:`.limits`) and
output files written whole or not at all (:mod:`.outputs`)."""
