"""The SQLite backend: renderings, pragmas and begin statements (``backend``), opening a file
safely beside other openers (``opening``), owner-only files (``files``), the write-ahead log's
checkpoints (``checkpoints``) and an application's outbox engine (``engine``)."""
