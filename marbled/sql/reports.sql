-- Queries for centre staff. Run with: sqlite3 -header -column marble.db < sql/reports.sql
-- (or one at a time). Read-only, and safe while the broker runs (WAL mode).
-- `marble report NAME` runs the query after `-- name: NAME` (the comment lines under it
-- are its description), and docs/reports.md says what the figures mean. Times are Unix
-- seconds, or seconds since the file's first event (columns ending in _s). A run still
-- open (a live broker) counts up to now.

-- name: summary
-- The file at a glance: settings, jobs by outcome, runs, suspensions.
-- (The settings are those of the broker's last start: meta.)
SELECT (SELECT value FROM meta WHERE key = 'schema_version') AS schema_version,
       (SELECT value FROM meta WHERE key = 'policy') AS policy,
       (SELECT value FROM meta WHERE key = 'profile') AS profile,
       (SELECT CAST(value AS REAL) FROM meta WHERE key = 'time_scale') AS time_scale,
       (SELECT count(*) FROM json_each((SELECT value FROM meta WHERE key = 'nodes'))) AS nodes,
       (SELECT sum(json_array_length(value))
        FROM json_each((SELECT value FROM meta WHERE key = 'nodes'))) AS gpus,
       datetime((SELECT min(at) FROM events), 'unixepoch') AS first_event,
       datetime((SELECT max(at) FROM events), 'unixepoch') AS last_event,
       (SELECT count(*) FROM events WHERE kind = 'drain') AS drains,
       (SELECT count(*) FROM jobs) AS jobs,
       (SELECT count(*) FROM jobs WHERE state = 'done') AS done,
       (SELECT count(*) FROM jobs WHERE state = 'failed') AS failed,
       (SELECT count(*) FROM jobs WHERE state = 'cancelled') AS cancelled,
       (SELECT count(*) FROM jobs WHERE state NOT IN ('done', 'failed', 'cancelled')) AS unfinished,
       (SELECT count(*) FROM runs) AS runs,
       (SELECT count(*) FROM runs WHERE end_reason = 'suspended') AS suspensions;

-- name: timeline
-- Per job, its life in order: queued, its runs (role, GPUs), suspended.
-- A row per phase: queued (submitted to its first run), each run as primary or
-- secondary on its GPUs, suspended (or waiting to retry) between two runs.
WITH t0(t0) AS (SELECT min(at) FROM events),
now(now) AS (SELECT (julianday('now') - 2440587.5) * 86400.0),
r AS (SELECT r.*, row_number() OVER w AS n, lag(r.ended_at) OVER w AS prev_end,
             lag(r.end_reason) OVER w AS prev_reason, lead(r.id) OVER w AS next_id
      FROM runs r WINDOW w AS (PARTITION BY r.job_id ORDER BY r.started_at, r.id)),
phases AS (
  -- queued: submitted to its first run (to its end if it never ran, open while it waits)
  SELECT j.id AS job_id, 0 AS ord, 'queued' AS phase, NULL AS run_id, NULL AS node,
         NULL AS gpu_ids, NULL AS gpus, NULL AS share, j.submitted_at AS s,
         coalesce((SELECT min(started_at) FROM runs WHERE job_id = j.id), j.finished_at) AS e,
         NULL AS start_step, NULL AS end_step,
         CASE WHEN EXISTS (SELECT 1 FROM runs WHERE job_id = j.id) THEN 'started'
              ELSE j.state END AS outcome
  FROM jobs j
  UNION ALL
  SELECT job_id, 2 * n, role, id, node, gpu_ids, gpu_count, share, started_at, ended_at,
         start_step, end_step, coalesce(end_reason, 'running')
  FROM r
  UNION ALL
  -- off the GPUs between two runs: suspended, or waiting to retry after a failure
  SELECT job_id, 2 * n - 1, CASE WHEN prev_reason = 'suspended' THEN 'suspended'
                                 ELSE 'waiting' END, NULL, NULL, NULL, NULL, NULL, prev_end,
         started_at, NULL, NULL, 'resumed'
  FROM r WHERE n > 1
  UNION ALL
  -- after its last run, a job not finished waits to be resumed (open)
  SELECT r.job_id, 2 * r.n + 1, CASE WHEN r.end_reason = 'suspended' THEN 'suspended'
                                     ELSE 'waiting' END, NULL, NULL, NULL, NULL, NULL,
         r.ended_at, NULL,
         NULL, NULL, j.state
  FROM r JOIN jobs j ON j.id = r.job_id
  WHERE r.next_id IS NULL AND r.ended_at IS NOT NULL
    AND j.state NOT IN ('done', 'failed', 'cancelled'))
SELECT p.job_id, j.name, j.model, p.phase, p.run_id, p.node, p.gpu_ids, p.gpus, p.share,
       round(p.s - t0, 3) AS start_s, round(p.e - t0, 3) AS end_s,
       round(coalesce(p.e, now) - p.s, 3) AS seconds,
       p.start_step, p.end_step, p.outcome
FROM phases p JOIN jobs j ON j.id = p.job_id, t0, now
ORDER BY p.job_id, p.ord;

-- name: gpu_hours
-- GPU-hours per allocation and in all: used, lost to suspend/resume, idle.
-- capacity = GPUs x the allocation's span (its first event to its last), used = held by
-- runs (GPUs x seconds, 1/n for a run on 1/n of a GPU) = training + lost, idle =
-- capacity - used. GPUs: the broker's last start (meta.nodes), for every allocation.
WITH now(now) AS (SELECT (julianday('now') - 2440587.5) * 86400.0),
gpus(gpus) AS (SELECT sum(json_array_length(value))
               FROM json_each((SELECT value FROM meta WHERE key = 'nodes'))),
drains AS (SELECT row_number() OVER (ORDER BY id) AS alloc, at FROM events WHERE kind = 'drain'),
-- a run belongs to the allocation whose drain came after its start
r AS (SELECT r.*, 1 + (SELECT count(*) FROM drains d WHERE d.at < r.started_at) AS alloc,
             coalesce(r.ended_at, now) AS end_at, r.gpu_count * 1.0 / r.share AS held,
             lag(r.end_reason) OVER (PARTITION BY r.job_id ORDER BY r.started_at, r.id) AS before
      FROM runs r, now),
spans AS (
  SELECT alloc, min(s) AS start_at, max(e) AS end_at FROM (
    SELECT alloc, started_at AS s, end_at AS e FROM r
    UNION ALL
    SELECT 1 + (SELECT count(*) FROM drains d WHERE d.at < e.at), at, at
    FROM events e WHERE kind = 'submitted'
    UNION ALL
    SELECT alloc, at, at FROM drains)
  GROUP BY alloc),
-- lost: a suspended run's GPUs from the request to its exit (checkpoint), and a resumed
-- run's from its start to its first step (start-up, restore), or to its own suspension
-- request (or its end) if it never got to a step. A run whose end recorded no phases
-- (adopted after a crash) counts no start-up.
asked AS (SELECT run_id, max(at) AS at FROM events WHERE kind = 'suspend-requested'
          GROUP BY run_id),
lost AS (
  SELECT r.alloc, r.held * max(0, r.ended_at - q.at) AS gpu_s
  FROM r JOIN asked q ON q.run_id = r.id
  WHERE r.end_reason = 'suspended'
  UNION ALL
  SELECT r.alloc, r.held * max(0, min(coalesce(json_extract(e.data, '$.phases.first_step'),
                                               q.at, r.end_at), r.end_at) - r.started_at)
  FROM r JOIN events e ON e.id = (SELECT max(id) FROM events WHERE run_id = r.id
                                  AND json_extract(data, '$.phases') IS NOT NULL)
  LEFT JOIN asked q ON q.run_id = r.id
  WHERE r.before = 'suspended'),
a AS (SELECT s.alloc, s.start_at, s.end_at, g.gpus, g.gpus * (s.end_at - s.start_at) AS capacity,
             (SELECT coalesce(sum(held * (end_at - started_at)), 0) FROM r
              WHERE r.alloc = s.alloc) AS used,
             (SELECT coalesce(sum(gpu_s), 0) FROM lost WHERE lost.alloc = s.alloc) AS lost
      FROM spans s, gpus g)
SELECT alloc AS allocation, datetime(start_at, 'unixepoch') AS started,
       round((end_at - start_at) / 3600.0, 6) AS hours, gpus,
       round(capacity / 3600.0, 6) AS capacity_gpu_h, round(used / 3600.0, 6) AS used_gpu_h,
       round((used - lost) / 3600.0, 6) AS training_gpu_h, round(lost / 3600.0, 6) AS lost_gpu_h,
       round((capacity - used) / 3600.0, 6) AS idle_gpu_h,
       round(used / nullif(capacity, 0), 4) AS utilization
FROM a
UNION ALL
SELECT 'all', datetime(min(start_at), 'unixepoch'), round(sum(end_at - start_at) / 3600.0, 6),
       max(gpus), round(sum(capacity) / 3600.0, 6), round(sum(used) / 3600.0, 6),
       round(sum(used - lost) / 3600.0, 6), round(sum(lost) / 3600.0, 6),
       round(sum(capacity - used) / 3600.0, 6), round(sum(used) / nullif(sum(capacity), 0), 4)
FROM a HAVING count(*) > 0;

-- name: suspensions
-- Every suspension: why, its acknowledgement, its resumption, its cost.
-- cost_gpu_s = the suspended run's GPUs x (request to exit) + the resumed run's GPUs x
-- (its start to its first step, or to its own suspension request if it never got to a
-- step: gpu_hours counts the same). forced = 1: no acknowledgement, stopped by force.
WITH t0(t0) AS (SELECT min(at) FROM events),
asked AS (SELECT run_id, max(at) AS at FROM events WHERE kind = 'suspend-requested'
          GROUP BY run_id),
r AS (SELECT r.*, r.gpu_count * 1.0 / r.share AS held,
             lead(r.id) OVER (PARTITION BY r.job_id ORDER BY r.started_at, r.id) AS next_id
      FROM runs r),
-- a resumed run's start-up ends at its first step (see above)
ready AS (SELECT r.id AS run_id,
                 min(coalesce(json_extract(e.data, '$.phases.first_step'), a.at, r.ended_at),
                     r.ended_at) AS at
          FROM r JOIN events e ON e.id = (SELECT max(id) FROM events WHERE run_id = r.id
                                          AND json_extract(data, '$.phases') IS NOT NULL)
          LEFT JOIN asked a ON a.run_id = r.id)
SELECT s.job_id, j.model, s.id AS run_id, s.role, s.gpu_count AS gpus,
       round(q.at - t0, 3) AS requested_s,
       (SELECT json_extract(data, '$.reason') FROM events WHERE kind = 'suspend-requested'
        AND run_id = s.id ORDER BY id DESC LIMIT 1) AS reason,
       s.end_step AS step, round(json_extract(ack.data, '$.latency'), 3) AS ack_latency_s,
       ack.id IS NULL AS forced,
       round(s.ended_at - q.at, 3) AS suspend_s,
       n.id AS resumed_run, n.gpu_count AS resumed_gpus, round(n.started_at - t0, 3) AS resumed_s,
       round(n.started_at - s.ended_at, 3) AS off_gpus_s,
       round(ready.at - n.started_at, 3) AS resume_s,
       s.end_step - n.start_step AS steps_redone,
       round(s.held * max(0, coalesce(s.ended_at - q.at, 0))
             + coalesce(n.held * max(0, ready.at - n.started_at), 0), 3) AS cost_gpu_s
FROM r s JOIN jobs j ON j.id = s.job_id
LEFT JOIN asked q ON q.run_id = s.id
LEFT JOIN events ack ON ack.id = (SELECT max(id) FROM events
                                  WHERE kind = 'acknowledged' AND run_id = s.id)
LEFT JOIN r n ON n.id = s.next_id
LEFT JOIN ready ON ready.run_id = n.id, t0
WHERE s.end_reason = 'suspended'
ORDER BY s.ended_at, s.id;

-- name: throughput
-- What runs measured per model and GPU count, against the profile.
-- From the samples table (steps/s, or seconds for startup and suspend, emulated jobs in
-- profiled seconds). marble report adds the profile's figure and measured/profile.
SELECT model, kind, gpus, share, count(*) AS samples, round(avg(value), 4) AS measured,
       round(min(value), 4) AS low, round(max(value), 4) AS high
FROM samples
GROUP BY model, kind, gpus, share
ORDER BY model, kind = 'throughput' DESC, kind, gpus, share;

-- name: allocations
-- Per allocation: when, how long, why it ended, what ran, utilization.
-- Allocations are told apart by the broker's drains (its end, a shutdown).
WITH t0(t0) AS (SELECT min(at) FROM events),
now(now) AS (SELECT (julianday('now') - 2440587.5) * 86400.0),
gpus(gpus) AS (SELECT sum(json_array_length(value))
               FROM json_each((SELECT value FROM meta WHERE key = 'nodes'))),
drains AS (SELECT row_number() OVER (ORDER BY id) AS alloc, at,
                  json_extract(data, '$.reason') AS reason FROM events WHERE kind = 'drain'),
r AS (SELECT r.*, 1 + (SELECT count(*) FROM drains d WHERE d.at < r.started_at) AS alloc,
             coalesce(r.ended_at, now) AS end_at, r.gpu_count * 1.0 / r.share AS held
      FROM runs r, now),
sub AS (SELECT 1 + (SELECT count(*) FROM drains d WHERE d.at < e.at) AS alloc, at
        FROM events e WHERE kind = 'submitted'),
spans AS (
  SELECT alloc, min(s) AS start_at, max(e) AS end_at FROM (
    SELECT alloc, started_at AS s, end_at AS e FROM r
    UNION ALL SELECT alloc, at, at FROM sub
    UNION ALL SELECT alloc, at, at FROM drains)
  GROUP BY alloc)
SELECT s.alloc AS allocation, datetime(s.start_at, 'unixepoch') AS started,
       datetime(s.end_at, 'unixepoch') AS ended, round(s.start_at - t0, 3) AS start_s,
       round(s.end_at - t0, 3) AS end_s, round(s.end_at - s.start_at, 3) AS seconds,
       g.gpus, coalesce(d.reason, 'no drain recorded (running, or the broker died)') AS ended_by,
       (SELECT count(*) FROM sub WHERE sub.alloc = s.alloc) AS submitted,
       (SELECT count(*) FROM r WHERE r.alloc = s.alloc) AS runs,
       (SELECT count(*) FROM r WHERE r.alloc = s.alloc AND r.end_reason = 'done') AS done,
       (SELECT count(*) FROM r WHERE r.alloc = s.alloc AND r.end_reason = 'suspended')
         AS suspended,
       (SELECT count(*) FROM r WHERE r.alloc = s.alloc AND r.end_reason = 'failed') AS failed,
       (SELECT round(sum(held * (end_at - started_at)) / 3600.0, 6) FROM r
        WHERE r.alloc = s.alloc) AS used_gpu_h,
       round((SELECT sum(held * (end_at - started_at)) FROM r WHERE r.alloc = s.alloc)
             / nullif(g.gpus * (s.end_at - s.start_at), 0), 4) AS utilization
FROM spans s LEFT JOIN drains d ON d.alloc = s.alloc, gpus g, t0
ORDER BY s.alloc;

-- name: schedule
-- Who ran where, on how many GPUs, as what, for how long.
SELECT r.job_id, j.model, r.role, r.node, r.gpu_ids, r.gpu_count,
       datetime(r.started_at, 'unixepoch') AS started,
       round(coalesce(r.ended_at, strftime('%s', 'now')) - r.started_at, 1) AS seconds,
       r.start_step, r.end_step, r.end_reason
FROM runs r JOIN jobs j ON j.id = r.job_id
ORDER BY r.started_at, r.id;

-- name: jobs
-- Per job: wait, run time, suspensions, outcome.
SELECT j.id, j.model, j.steps, j.state, j.suspensions,
       round(j.started_at - j.submitted_at, 1) AS waited_s,
       round(j.finished_at - j.started_at, 1) AS ran_s,
       j.exit_code, j.reason
FROM jobs j ORDER BY j.id;

-- name: roles
-- GPU-seconds used, by role (how much work ran on leftover GPUs).
SELECT role, round(sum(gpu_count * (coalesce(ended_at, strftime('%s', 'now')) - started_at)), 1)
       AS gpu_seconds, count(*) AS runs
FROM runs GROUP BY role;

-- name: problems
-- Everything that went wrong.
SELECT datetime(at, 'unixepoch') AS at, kind, job_id, run_id, data
FROM events WHERE kind IN ('failed', 'suspend-timeout', 'stop', 'lost', 'cancelled')
ORDER BY id;

-- name: gpu_use
-- GPU use per job from NVML (marbled --sample-interval, real GPUs only).
SELECT job_id, count(*) AS samples, round(avg(util_gpu), 1) AS gpu_busy_pct,
       round(max(mem_used) / 1073741824.0, 2) AS peak_mem_gib
FROM gpu_samples WHERE job_id IS NOT NULL GROUP BY job_id ORDER BY job_id;
