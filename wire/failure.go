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
	// FailureLauncherMissing: the launcher is not on the workers' PATH.
	FailureLauncherMissing = "launcher_missing"
)

// FailureLauncherOption: the node's own launcher reads one of the job's
// launcher.extra_args as an option rdzv sets, or cannot start the
// workers with one the job gave.
const FailureLauncherOption = "launcher_option"
