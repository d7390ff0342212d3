BEGIN TRANSACTION;
CREATE TABLE zeus_arms (
	job_id VARCHAR(255) NOT NULL, 
	batch_size INTEGER NOT NULL, 
	state TEXT NOT NULL, 
	PRIMARY KEY (job_id, batch_size)
);
INSERT INTO "zeus_arms" VALUES('j',8,'{"n": 1}');
INSERT INTO "zeus_arms" VALUES('j',16,'{"n": 0}');
CREATE TABLE zeus_bandits (
	job_id VARCHAR(255) NOT NULL, 
	state TEXT NOT NULL, 
	version INTEGER NOT NULL, 
	PRIMARY KEY (job_id)
);
INSERT INTO "zeus_bandits" VALUES('j','{"phase": "pruning", "min_cost": 7.0}',2);
CREATE TABLE zeus_jobs (
	job_id VARCHAR(255) NOT NULL, 
	created_at DOUBLE NOT NULL, 
	info TEXT NOT NULL, 
	PRIMARY KEY (job_id)
);
INSERT INTO "zeus_jobs" VALUES('j',1.0,'{"w": 1}');
CREATE TABLE zeus_profiles (
	"key" VARCHAR(255) NOT NULL, 
	table_json TEXT NOT NULL, 
	updated_at DOUBLE NOT NULL, 
	PRIMARY KEY ("key")
);
INSERT INTO "zeus_profiles" VALUES('A40/bs8','{"limits_W": [200.0, 300.0], "time_s": [1.25, 1.0]}',3.0);
CREATE TABLE zeus_schema_version (
	version INTEGER NOT NULL
);
INSERT INTO "zeus_schema_version" VALUES(2);
CREATE TABLE zeus_trials (
	trial_id INTEGER NOT NULL, 
	job_id VARCHAR(255) NOT NULL, 
	batch_size INTEGER NOT NULL, 
	"power_limit_W" DOUBLE, 
	status VARCHAR(16) NOT NULL, 
	"energy_J" DOUBLE, 
	time_s DOUBLE, 
	cost DOUBLE, 
	converged BOOLEAN NOT NULL, 
	started_at DOUBLE NOT NULL, 
	ended_at DOUBLE, 
	pid INTEGER NOT NULL, 
	host VARCHAR(255) NOT NULL, 
	info TEXT NOT NULL, owner VARCHAR(255) NOT NULL DEFAULT '', heartbeat_at DOUBLE, 
	PRIMARY KEY (trial_id), 
	FOREIGN KEY(job_id) REFERENCES zeus_jobs (job_id)
);
INSERT INTO "zeus_trials" VALUES(1,'j',8,250.0,'completed',10.5,2.25,7.0,1,2.0,3.0,1,'elsewhere','{"round": 0}','',5.0);
INSERT INTO "zeus_trials" VALUES(2,'j',16,NULL,'running',NULL,NULL,NULL,0,4.0,NULL,1,'elsewhere','{}','',5.0);
CREATE INDEX zeus_trials_by_job ON zeus_trials (job_id, trial_id);
CREATE INDEX zeus_trials_by_status ON zeus_trials (status);
COMMIT;
