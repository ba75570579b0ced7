-- Queries for centre staff. Run with: sqlite3 -header -column marble.db < sql/reports.sql
-- (or one at a time). Read-only, and safe while the broker runs (WAL mode).

-- 1. The schedule: who ran where, on how many GPUs, as what, for how long.
SELECT r.job_id, j.model, r.role, r.node, r.gpu_ids, r.gpu_count,
       datetime(r.started_at, 'unixepoch') AS started,
       round(coalesce(r.ended_at, strftime('%s', 'now')) - r.started_at, 1) AS seconds,
       r.start_step, r.end_step, r.end_reason
FROM runs r JOIN jobs j ON j.id = r.job_id
ORDER BY r.started_at, r.id;

-- 2. Per job: wait, run time, suspensions, outcome.
SELECT j.id, j.model, j.steps, j.state, j.suspensions,
       round(j.started_at - j.submitted_at, 1) AS waited_s,
       round(j.finished_at - j.started_at, 1) AS ran_s,
       j.exit_code, j.reason
FROM jobs j ORDER BY j.id;

-- 3. GPU-seconds used, by role (how much work ran on leftover GPUs).
SELECT role, round(sum(gpu_count * (coalesce(ended_at, strftime('%s', 'now')) - started_at)), 1)
       AS gpu_seconds, count(*) AS runs
FROM runs GROUP BY role;

-- 4. Suspensions: latency from SIGTSTP to the job's acknowledgement.
SELECT job_id, run_id, json_extract(data, '$.step') AS step,
       round(json_extract(data, '$.latency'), 3) AS ack_latency_s
FROM events WHERE kind = 'acknowledged' ORDER BY id;

-- 5. Everything that went wrong.
SELECT datetime(at, 'unixepoch') AS at, kind, job_id, run_id, data
FROM events WHERE kind IN ('failed', 'suspend-timeout', 'stop', 'lost', 'cancelled')
ORDER BY id;

-- 6. GPU use per job, from the NVML samples (marbled --sample-interval, real GPUs only).
SELECT job_id, count(*) AS samples, round(avg(util_gpu), 1) AS gpu_busy_pct,
       round(max(mem_used) / 1073741824.0, 2) AS peak_mem_gib
FROM gpu_samples WHERE job_id IS NOT NULL GROUP BY job_id ORDER BY job_id;
