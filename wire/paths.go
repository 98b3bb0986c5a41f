package wire

import (
	"fmt"
	"path/filepath"
	"strings"
)

// CheckPath checks a path that names a place on a node: p must be
// absolute and clean ("/a/b", not "a/b", "/a/../b", "/a/./b", "/a/" or
// "/a//b"), so that what was checked is what is opened, and, when dir is
// not empty, strictly inside dir (see Within). The error names field and p
// and says what was expected; nil means p is acceptable. Whether p exists
// is for the caller to find out.
func CheckPath(field, p, dir string) *FieldError {
	switch {
	case !filepath.IsAbs(p):
		return &FieldError{Field: field, Value: Quote(p), Reason: "must be an absolute path"}
	case filepath.Clean(p) != p:
		return &FieldError{Field: field, Value: Quote(p), Reason: fmt.Sprintf("must be a clean path without '..', '.' or repeated '/' elements, as %s", Quote(filepath.Clean(p)))}
	case dir != "" && !Within(dir, p):
		return &FieldError{Field: field, Value: Quote(p), Reason: "must be inside " + filepath.Clean(dir)}
	}
	return nil
}

// Within reports whether path lies strictly inside dir, both absolute:
// dir itself, dir's parent and a sibling that shares a prefix
// ("/ckpt-evil" for "/ckpt") are not inside. Only a ".." element leads
// out: an entry named "..step-10" is inside. Symbolic links are not
// followed; callers that must, resolve both first.
func Within(dir, path string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}
