// Package buildinfo is what a binary says about itself (`--version`,
// `rdzvctl version`, the server's answer to GetServerInfo, the
// rdzv_build_info metric). The Makefile sets Version and Commit with
// -ldflags; a plain `go build` falls back to the module's build info, so a
// binary never claims a version it was not built from.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set by the Makefile: -X github.com/rdzv/rdzv/buildinfo.Version=... .
var (
	Version = ""
	Commit  = ""
)

// Info is one binary's build.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"go_version"`
	Platform  string `json:"platform"`
}

// Get returns this binary's build.
func Get() Info {
	info := Info{Version: Version, Commit: Commit, GoVersion: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && info.Commit == "" {
				info.Commit = s.Value
			}
		}
	}
	if info.Version == "" {
		info.Version = "dev"
	}
	if info.Commit == "" {
		info.Commit = "unknown"
	}
	return info
}

// String is the one-line form `--version` prints.
func (i Info) String() string {
	return fmt.Sprintf("%s (commit %s, %s, %s)", i.Version, i.Commit, i.GoVersion, i.Platform)
}
