package cli

import (
	"fmt"
	"os"
	"strings"
)

// DaemonsDoc is the generated flag and config reference of the daemons.
// Each daemon's sections lie between their markers: its --help, and the
// table of its config file's fields made from the code (clitest
// ConfigReference), so the reference cannot drift from the flags or the
// fields: each daemon's tests compare them, and `make docs` (go test ...
// -update) rewrites the sections.
const DaemonsDoc = "docs/daemons.md"

// DocSection returns doc with the section named section replaced by body.
func DocSection(doc, section, body string) (string, error) {
	begin, end := "<!-- BEGIN "+section+" (generated: make docs) -->\n", "<!-- END "+section+" -->"
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		return "", fmt.Errorf("%s has no section %s between %q and %q", DaemonsDoc, section, strings.TrimSpace(begin), end)
	}
	return doc[:i+len(begin)] + body + doc[j:], nil
}

// CheckDoc compares the section of the reference at path with body, or
// rewrites it when update is set. It returns an error when the section
// is stale.
func CheckDoc(path, section, body string, update bool) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	want, err := DocSection(string(data), section, body)
	if err != nil {
		return err
	}
	if update {
		return os.WriteFile(path, []byte(want), 0o644)
	}
	if want != string(data) {
		return fmt.Errorf("%s: the section %s is not what the code says; run `make docs`", path, section)
	}
	return nil
}
