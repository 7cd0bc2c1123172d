package topo

import "testing"

func BenchmarkWonderProxy(b *testing.B) {
	for b.Loop() {
		WonderProxy()
	}
}

func BenchmarkRocketfuelRouters1239(b *testing.B) {
	for b.Loop() {
		if _, err := Rocketfuel("1239", false); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEvalGraphs(b *testing.B) {
	for b.Loop() {
		if _, err := EvalGraphs(7, 115); err != nil {
			b.Fatal(err)
		}
	}
}
