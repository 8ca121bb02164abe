"""The PostgreSQL backend (psycopg 3): renderings, locks and failure codes (``backend``), opening
a URL or Engine (``opening``), the hot statements as named server-side statements
(``server_statements``), the claim tactics among concurrent writers (``claim_locks``,
``cycle_read``, ``cycle_statement``) and ``NOTIFY`` wake-ups (``wakeups``)."""
