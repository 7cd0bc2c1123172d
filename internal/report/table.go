package report

import (
	"fmt"
	"io"
	"strings"
)

// Align is a column's alignment in a markdown table.
type Align int

const (
	Left Align = iota
	Right
	Center
)

// Table is a markdown table. Rows shorter than Header are padded with empty
// cells; longer rows are an error.
type Table struct {
	Header []string
	Align  []Align // per column; missing entries mean Left
	Rows   [][]string
}

// AddRow appends a row of cells.
func (t *Table) AddRow(cells ...string) { t.Rows = append(t.Rows, cells) }

// WriteMarkdown writes t as a GitHub-flavoured markdown table with columns
// padded to equal width. Pipes in cells are escaped, newlines become spaces.
func (t *Table) WriteMarkdown(w io.Writer) error {
	n := len(t.Header)
	if n == 0 {
		return fmt.Errorf("report: table has no columns")
	}
	cell := func(s string) string {
		s = strings.ReplaceAll(s, "\n", " ")
		return strings.ReplaceAll(s, "|", `\|`)
	}
	width := make([]int, n)
	for i, h := range t.Header {
		width[i] = max(3, len([]rune(cell(h))))
	}
	for r, row := range t.Rows {
		if len(row) > n {
			return fmt.Errorf("report: table row %d has %d cells for %d columns", r, len(row), n)
		}
		for i, c := range row {
			width[i] = max(width[i], len([]rune(cell(c))))
		}
	}
	align := func(i int) Align {
		if i < len(t.Align) {
			return t.Align[i]
		}
		return Left
	}
	var b strings.Builder
	line := func(cells []string) {
		b.WriteString("|")
		for i := 0; i < n; i++ {
			c := ""
			if i < len(cells) {
				c = cell(cells[i])
			}
			pad := width[i] - len([]rune(c))
			switch align(i) {
			case Right:
				c = strings.Repeat(" ", pad) + c
			case Center:
				c = strings.Repeat(" ", pad/2) + c + strings.Repeat(" ", pad-pad/2)
			default:
				c += strings.Repeat(" ", pad)
			}
			b.WriteString(" " + c + " |")
		}
		b.WriteString("\n")
	}
	line(t.Header)
	b.WriteString("|")
	for i := 0; i < n; i++ {
		d := strings.Repeat("-", width[i])
		switch align(i) {
		case Right:
			d = d[1:] + ":"
		case Center:
			d = ":" + d[2:] + ":"
		}
		b.WriteString(" " + d + " |")
	}
	b.WriteString("\n")
	for _, row := range t.Rows {
		line(row)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
