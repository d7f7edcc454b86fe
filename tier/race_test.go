//go:build race

package tier

// raceDetector says the tests run under the race detector, which makes
// every goroutine several times slower.
const raceDetector = true
