package wire

// Failure classes an agent reports in WorkerStatus.failure when a job's
// workers cannot start on a node because of the job's configuration there.
// A restart would fail the same way, so the controller fails the job with
// the class and the agent's message instead of restarting it.
const (
	// FailureWorkdirMissing: the job's workdir is not a directory on the node.
	FailureWorkdirMissing = "workdir_missing"
	// FailureCheckpointDirMissing: neither checkpoint.dir nor its parent
	// (the job may create the directory itself) is a directory on the node.
	FailureCheckpointDirMissing = "checkpoint_dir_missing"
	// FailureCheckpointDirNotWritable: the job's user cannot create a file
	// in checkpoint.dir (or, if it does not exist yet, in its parent): a
	// read-only mount, the agent unit's sandbox (ProtectSystem=strict
	// without the directory in ReadWritePaths=) or permissions.
	FailureCheckpointDirNotWritable = "checkpoint_dir_not_writable"
	// FailureLauncherMissing: the launcher is not on the workers' PATH.
	FailureLauncherMissing = "launcher_missing"
)

// FailureMemoryFetch: the agent could not fetch a rank's in-memory
// checkpoint shard from the peer holding it before starting the workers.
// Unlike the others it is restarted: the next attempt resumes from another
// in-memory step or from the durable checkpoint.
const FailureMemoryFetch = "memory_fetch"

// FailureLauncherOption: the node's own launcher reads one of the job's
// launcher.extra_args as an option rdzv sets, or cannot start the
// workers with one the job gave.
const FailureLauncherOption = "launcher_option"
