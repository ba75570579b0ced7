"""Staff reports on a broker's state file (`marble report`), in three parts each read and
tested alone: `queries` (the SQL of sql/reports.sql on a read-only connection), `figures`
(what is computed from the rows: bars, GPUs in use, GPU-seconds, the picture's content),
and `draw` (matplotlib, imported only when a PNG is asked for)."""
