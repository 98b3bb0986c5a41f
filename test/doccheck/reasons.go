package doccheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// StringConsts returns the string constants declared in the Go package in
// dir (test files left out) whose names match name, by value. It reads the
// source, so it finds unexported constants and every one of a group that
// no list in the code may enumerate.
func StringConsts(dir string, name *regexp.Regexp) (map[string]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	consts := map[string]string{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, 0)
		if err != nil {
			return nil, fmt.Errorf("parsing %s: %w", dir, err)
		}
		{
			for _, decl := range f.Decls {
				gen, ok := decl.(*ast.GenDecl)
				if !ok || gen.Tok != token.CONST {
					continue
				}
				for _, spec := range gen.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, id := range vs.Names {
						if !name.MatchString(id.Name) || i >= len(vs.Values) {
							continue
						}
						lit, ok := vs.Values[i].(*ast.BasicLit)
						if !ok || lit.Kind != token.STRING {
							continue
						}
						v, err := strconv.Unquote(lit.Value)
						if err != nil {
							return nil, fmt.Errorf("%s: %s: %w", fset.Position(lit.Pos()), id.Name, err)
						}
						consts[v] = id.Name
					}
				}
			}
		}
	}
	return consts, nil
}

// TableKeys returns the first cells of a Markdown document's table rows
// that are a code span, `like_this`, without the backticks.
func TableKeys(text string) map[string]bool {
	keys := map[string]bool{}
	for _, l := range strings.Split(text, "\n") {
		if m := tableKeyRe.FindStringSubmatch(l); m != nil {
			keys[m[1]] = true
		}
	}
	return keys
}

// Section returns the text under the heading with this text, up to the
// next heading (a subsection ends it too); empty when there is none.
func Section(text, heading string) string {
	ls, inCode := lines(text)
	var out []string
	in := false
	for i, l := range ls {
		if !inCode[i] && headingRe.MatchString(l) {
			if in {
				break
			}
			in = headingRe.FindStringSubmatch(l)[2] == heading
			continue
		}
		if in {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

var tableKeyRe = regexp.MustCompile("^\\|\\s*`([^`]+)`\\s*\\|")
