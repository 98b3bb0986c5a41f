package cli

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// PprofFlag is a daemon's --pprof-socket (see ServePprof).
func PprofFlag(fs *flag.FlagSet) *string {
	return fs.String("pprof-socket", "", "serve Go's runtime profiles (net/http/pprof) on this Unix socket, mode 0600, for profiling (off when empty)")
}

// ServePprof serves Go's profiles (CPU, heap, goroutines) on a Unix socket
// that only the daemon's user and root can open, never on a TCP port:
// profiles show the process's stacks and allocation sites. A socket left
// by a daemon that crashed is replaced; any other file is refused.
func ServePprof(path string, log *zap.Logger) error {
	if info, err := os.Lstat(path); err == nil {
		if info.Mode()&os.ModeSocket == 0 {
			return fmt.Errorf("--pprof-socket: %s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("--pprof-socket: removing the stale socket: %w", err)
		}
	}
	// Created 0600 from the start, not chmod-ed after a window.
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return fmt.Errorf("--pprof-socket: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Warn("serving runtime profiles", zap.String("socket", path))
	go func() {
		if err := srv.Serve(ln); err != nil {
			log.Error("profile server stopped", zap.Error(err))
		}
	}()
	return nil
}
