BEGIN TRANSACTION;
CREATE TABLE arms (job_id TEXT NOT NULL, batch_size INTEGER NOT NULL, state TEXT NOT NULL, PRIMARY KEY (job_id, batch_size));
INSERT INTO "arms" VALUES('j',8,'{"n": 1}');
INSERT INTO "arms" VALUES('j',16,'{"n": 0}');
CREATE TABLE bandits (job_id TEXT PRIMARY KEY, state TEXT NOT NULL, version INTEGER NOT NULL);
INSERT INTO "bandits" VALUES('j','{"phase": "pruning", "min_cost": 7.0}',2);
CREATE TABLE jobs (job_id TEXT PRIMARY KEY, created_at REAL NOT NULL, info TEXT NOT NULL);
INSERT INTO "jobs" VALUES('j',1.0,'{"w": 1}');
CREATE TABLE profiles (key TEXT PRIMARY KEY, table_json TEXT NOT NULL, updated_at REAL NOT NULL);
INSERT INTO "profiles" VALUES('A40/bs8','{"limits_W": [200.0, 300.0], "time_s": [1.25, 1.0]}',3.0);
CREATE TABLE schema_version (version INTEGER NOT NULL);
INSERT INTO "schema_version" VALUES(3);
CREATE TABLE trials (
            trial_id INTEGER PRIMARY KEY AUTOINCREMENT,
            job_id TEXT NOT NULL REFERENCES jobs(job_id),
            batch_size INTEGER NOT NULL,
            power_limit_W REAL,
            status TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'early_stopped')),
            energy_J REAL, time_s REAL, cost REAL,
            converged INTEGER NOT NULL DEFAULT 0,
            started_at REAL NOT NULL, ended_at REAL,
            pid INTEGER NOT NULL, host TEXT NOT NULL,
            info TEXT NOT NULL, owner TEXT NOT NULL DEFAULT '', heartbeat_at REAL, pending_id TEXT);
INSERT INTO "trials" VALUES(1,'j',8,250.0,'completed',10.5,2.25,7.0,1,2.0,3.0,1,'elsewhere','{"round": 0}','',5.0,'p-1');
INSERT INTO "trials" VALUES(2,'j',16,NULL,'running',NULL,NULL,NULL,0,4.0,NULL,1,'elsewhere','{}','',5.0,NULL);
CREATE INDEX trials_by_job ON trials (job_id, trial_id);
CREATE INDEX trials_by_status ON trials (status);
CREATE UNIQUE INDEX trials_by_pending_id ON trials (pending_id);
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('trials',2);
COMMIT;
