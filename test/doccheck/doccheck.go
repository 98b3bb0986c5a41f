// Package doccheck checks the project's Markdown documentation: that every
// relative link and #anchor in README.md and docs/ resolves (run by `make
// lint`), and that docs/troubleshooting.md explains every failure reason and
// event kind the controller records (run by `make unit`). Only its tests use
// it; no product code imports it.
package doccheck

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
)

// Link is one link found in a Markdown file.
type Link struct {
	// File is the path of the Markdown file holding the link.
	File string
	// Line is its 1-based line number.
	Line int
	// Target is the link as written: a path, a path#anchor or #anchor.
	Target string
}

var (
	fenceRe = regexp.MustCompile("^\\s*(```|~~~)")
	// An ATX heading: up to three spaces, 1-6 #, a space, the text, and an
	// optional closing run of #.
	headingRe = regexp.MustCompile(`^ {0,3}(#{1,6})\s+(.*?)(\s+#+)?\s*$`)
	// Inline links and images, [text](target "title"), and reference
	// definitions, [label]: target.
	inlineLinkRe = regexp.MustCompile(`\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	refDefRe     = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+"[^"]*")?\s*$`)
	codeSpanRe   = regexp.MustCompile("`+[^`]*`+")
	htmlIDRe     = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	schemeRe     = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
	// Markdown in heading text that GitHub renders away before it makes the
	// anchor: links keep their text, emphasis and code marks go.
	headingLinkRe = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
)

// Slug is the anchor GitHub gives a heading's text: lower case, Markdown
// marks and punctuation removed (letters, digits, '-' and '_' stay), each
// space a '-'. Duplicates are told apart by Anchors, not here.
func Slug(heading string) string {
	text := headingLinkRe.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// lines splits Markdown into lines, marking those inside fenced code blocks,
// where neither headings nor links count.
func lines(text string) (out []string, inCode []bool) {
	fenced := false
	for _, l := range strings.Split(text, "\n") {
		if fenceRe.MatchString(l) {
			fenced = !fenced
			out, inCode = append(out, l), append(inCode, true)
			continue
		}
		out, inCode = append(out, l), append(inCode, fenced)
	}
	return out, inCode
}

// Anchors lists the anchors a Markdown document defines: one per heading,
// with GitHub's -1, -2, ... suffixes for repeated headings, and the names of
// explicit <a name="..."> or <a id="..."> tags.
func Anchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	ls, inCode := lines(text)
	for i, l := range ls {
		if inCode[i] {
			continue
		}
		for _, m := range htmlIDRe.FindAllStringSubmatch(l, -1) {
			anchors[m[1]] = true
		}
		m := headingRe.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		slug := Slug(m[2])
		if n := seen[slug]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	return anchors
}

// Links lists the links of a Markdown document, outside code blocks and
// code spans.
func Links(file, text string) []Link {
	var links []Link
	ls, inCode := lines(text)
	for i, l := range ls {
		if inCode[i] {
			continue
		}
		if m := refDefRe.FindStringSubmatch(l); m != nil {
			links = append(links, Link{File: file, Line: i + 1, Target: m[1]})
			continue
		}
		for _, m := range inlineLinkRe.FindAllStringSubmatch(codeSpanRe.ReplaceAllString(l, ""), -1) {
			links = append(links, Link{File: file, Line: i + 1, Target: m[1]})
		}
	}
	return links
}

// Check resolves every relative link of the Markdown files (paths relative
// to root) and returns one error per link that does not: a missing file or
// directory, or an #anchor the target Markdown file does not define. Links
// with a scheme (https:, mailto:) are not followed.
func Check(root string, files []string) []error {
	var errs []error
	anchorsOf := map[string]map[string]bool{}
	anchors := func(path string) (map[string]bool, error) {
		if a, ok := anchorsOf[path]; ok {
			return a, nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		anchorsOf[path] = Anchors(string(data))
		return anchorsOf[path], nil
	}
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			errs = append(errs, fmt.Errorf("reading %s: %w", f, err))
			continue
		}
		for _, l := range Links(f, string(data)) {
			if schemeRe.MatchString(l.Target) {
				continue
			}
			path, anchor, _ := strings.Cut(l.Target, "#")
			target := filepath.Join(root, f)
			if path != "" {
				target = filepath.Join(root, filepath.Dir(f), filepath.FromSlash(path))
			}
			info, err := os.Stat(target)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s:%d: link %q: %s does not exist", l.File, l.Line, l.Target, path))
				continue
			}
			if anchor == "" {
				continue
			}
			if info.IsDir() || !strings.HasSuffix(target, ".md") {
				errs = append(errs, fmt.Errorf("%s:%d: link %q: an anchor into %s, which is not a Markdown file", l.File, l.Line, l.Target, path))
				continue
			}
			a, err := anchors(target)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s:%d: link %q: %w", l.File, l.Line, l.Target, err))
				continue
			}
			if !a[anchor] {
				errs = append(errs, fmt.Errorf("%s:%d: link %q: no heading in %s has the anchor #%s", l.File, l.Line, l.Target, filepath.Base(target), anchor))
			}
		}
	}
	return errs
}
