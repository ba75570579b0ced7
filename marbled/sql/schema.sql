-- marbled state database (marble.db in the broker's state directory), schema version 9.
-- The broker makes its tables with this file at every start (IF NOT EXISTS: what is missing);
-- marbled/store/orm.py describes them to SQLAlchemy; tests/core/test_sql_files.py keeps the
-- two in step.
-- Times are Unix seconds (REAL): datetime(started_at, 'unixepoch') reads them.

-- Every job ever submitted, in FIFO order (id).
CREATE TABLE IF NOT EXISTS jobs (
	id INTEGER NOT NULL,
	name VARCHAR(128),              -- optional user name, usable in `after`
	model VARCHAR(128),             -- model name looked up in the profile
	steps INTEGER,                  -- requested steps in all (MARBLE_TARGET_STEPS)
	gpus_request INTEGER,           -- NULL = auto (profile's optimal count, malleable)
	demand INTEGER NOT NULL,        -- GPU count the policy aims for (on each node)
	nodes INTEGER DEFAULT '1' NOT NULL, -- nodes the job runs on (demand GPUs on each)
	retries INTEGER DEFAULT '0' NOT NULL, -- failed runs started again, at most
	failures INTEGER DEFAULT '0' NOT NULL, -- failed runs so far
	not_before FLOAT,               -- a retry waits until then (back-off)
	malleable BOOLEAN NOT NULL,     -- may run as secondary and be suspended/resumed
	max_share INTEGER DEFAULT '1' NOT NULL, -- n > 1: may run on 1/n of a GPU (its profile says so)
	command JSON NOT NULL,          -- argv list; [] for emulated jobs
	emulate BOOLEAN NOT NULL,       -- marbled's EMULATED training job
	"after" JSON NOT NULL,          -- job ids that must be done first
	state VARCHAR(16) NOT NULL,     -- queued running suspending suspended done failed cancelled
	step INTEGER NOT NULL,          -- last step known from a checkpoint or the end
	suspensions INTEGER NOT NULL,
	submitted_at FLOAT NOT NULL,
	started_at FLOAT,
	finished_at FLOAT,
	exit_code INTEGER,
	reason VARCHAR,                 -- why it is in its state (last transition)
	chdir VARCHAR,                  -- the directory it runs in; NULL (before version 6): jobs/<id>/
	per_gpu BOOLEAN DEFAULT '0' NOT NULL, -- one process (rank) per GPU, started by marbled
	nodes_min INTEGER,              -- a node range MIN-nodes: its GPUs on fewer nodes; NULL: nodes
	env VARCHAR(32),                -- its environment (environments.digest); NULL: the broker's
	PRIMARY KEY (id)
);
CREATE INDEX IF NOT EXISTS ix_jobs_state ON jobs (state);
-- `after:` a name: the latest job of that name (made at any start if missing: no new version)
CREATE INDEX IF NOT EXISTS ix_jobs_name ON jobs (name);
-- what ended since a time: the dashboard's window (?since=; made at any start if missing)
CREATE INDEX IF NOT EXISTS ix_jobs_finished_at ON jobs (finished_at);

-- One row per launch segment: a job suspended once has two runs.
CREATE TABLE IF NOT EXISTS runs (
	id INTEGER NOT NULL,
	job_id INTEGER NOT NULL,
	node VARCHAR(128) NOT NULL,     -- a multi-node run: its nodes, 'n1,n2'
	gpu_ids VARCHAR NOT NULL,       -- GPU slots of the node, e.g. '0,1,2'; per node: '0,1;4,5'
	devices VARCHAR,                -- GPUs the run really got, as the batch system reported
	gpu_count INTEGER NOT NULL,     -- on all its nodes
	share INTEGER DEFAULT '1' NOT NULL, -- n > 1: the run had 1/n of its one GPU, shared
	role VARCHAR(16) NOT NULL,      -- primary | secondary
	started_at FLOAT NOT NULL,
	ended_at FLOAT,                 -- NULL while it runs
	start_step INTEGER,             -- step restored from the checkpoint
	end_step INTEGER,               -- step checkpointed or finished; NULL if stopped by force
	                                -- until the next run reports the step it resumed from
	exit_code INTEGER,              -- negative: killed by that signal
	end_reason VARCHAR,             -- done | suspended | failed | cancelled | lost
	pid INTEGER,
	pid_start INTEGER,              -- process start time (clock ticks), against pid reuse
	PRIMARY KEY (id),
	FOREIGN KEY(job_id) REFERENCES jobs (id)
);
CREATE INDEX IF NOT EXISTS ix_runs_job_id ON runs (job_id);
-- the open runs, which a broker's start adopts (made at any start if missing: no new version)
CREATE INDEX IF NOT EXISTS ix_runs_open ON runs (job_id) WHERE ended_at IS NULL;
CREATE INDEX IF NOT EXISTS ix_runs_ended_at ON runs (ended_at) WHERE ended_at IS NOT NULL;

-- Append-only journal: submitted started resumed suspend-requested acknowledged
-- suspend-timeout stop done suspended failed cancelled adopted drain placed
-- checkpoint-fallback prestarted go.
CREATE TABLE IF NOT EXISTS events (
	id INTEGER NOT NULL,
	at FLOAT NOT NULL,
	kind VARCHAR(32) NOT NULL,
	job_id INTEGER,
	run_id INTEGER,
	data JSON,                      -- details, e.g. {"step": 745, "latency": 0.02}
	PRIMARY KEY (id)
);
CREATE INDEX IF NOT EXISTS ix_events_job_id ON events (job_id);
CREATE INDEX IF NOT EXISTS ix_events_at ON events (at);
CREATE INDEX IF NOT EXISTS ix_events_kind ON events (kind);

-- NVML readings of the broker's own GPUs every --sample-interval (local launcher, real GPUs).
CREATE TABLE IF NOT EXISTS gpu_samples (
	id INTEGER NOT NULL,
	at FLOAT NOT NULL,
	node VARCHAR(128) NOT NULL,
	device VARCHAR(64) NOT NULL,    -- as in CUDA_VISIBLE_DEVICES
	job_id INTEGER,                 -- the job on the GPU then; NULL when idle
	util_gpu INTEGER NOT NULL,      -- percent of the sample period the GPU was busy
	util_mem INTEGER NOT NULL,      -- percent of it the memory was read or written
	mem_used INTEGER NOT NULL,      -- bytes
	mem_total INTEGER NOT NULL,
	PRIMARY KEY (id)
);
CREATE INDEX IF NOT EXISTS ix_gpu_samples_at ON gpu_samples (at);
CREATE INDEX IF NOT EXISTS ix_gpu_samples_job_id ON gpu_samples (job_id);

-- What runs measured of their models (the broker learns its curves from them): a run's
-- throughput at its GPU count over a window, its start-up, what a suspension took.
CREATE TABLE IF NOT EXISTS samples (
	id INTEGER NOT NULL,
	at FLOAT NOT NULL,
	model VARCHAR(128) NOT NULL,    -- as the job named it
	kind VARCHAR(16) NOT NULL,      -- throughput (steps/s) | startup | suspend (seconds)
	gpus INTEGER NOT NULL,          -- the run's GPU count (for throughput)
	share INTEGER DEFAULT '1' NOT NULL, -- n > 1: on 1/n of a GPU
	value FLOAT NOT NULL,           -- in the profile's seconds (emulated jobs: scaled)
	job_id INTEGER,
	run_id INTEGER,
	PRIMARY KEY (id)
);
CREATE INDEX IF NOT EXISTS ix_samples_model ON samples (model);

-- Submissions sent with an idempotency key (POST /v1/jobs' Idempotency-Key header, or its
-- client_token): a retry with the same key is answered with these jobs, not submitted again.
CREATE TABLE IF NOT EXISTS requests (
	"key" VARCHAR(255) NOT NULL,
	digest VARCHAR(64) NOT NULL,    -- sha256 of the jobs submitted (the same key, other jobs: 409)
	first_job INTEGER NOT NULL,     -- its jobs: ids first_job .. first_job + jobs - 1
	jobs INTEGER NOT NULL,
	at FLOAT NOT NULL,              -- when it was submitted
	PRIMARY KEY ("key")
);

-- The environments jobs run in (marble submit --export, docs/environment.md), each stored
-- once for all the jobs that share it.
CREATE TABLE IF NOT EXISTS environments (
	digest VARCHAR(32) NOT NULL,    -- what jobs.env names
	whole BOOLEAN NOT NULL,         -- ALL: vars are the whole environment; else added to the broker's
	vars JSON NOT NULL,             -- name -> value
	PRIMARY KEY (digest)
);

-- Broker settings of the last start: schema_version, policy, profile, nodes, ...
CREATE TABLE IF NOT EXISTS meta (
	"key" VARCHAR(64) NOT NULL,
	value VARCHAR NOT NULL,
	PRIMARY KEY ("key")
);
