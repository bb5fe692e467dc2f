// Command webhook feeds pod specs through Go HAMi's own admission webhook (the scheduler
// package's handler, which calls every device's MutateAdmission) and writes what it did, so
// that this project's webhook can be compared with it case by case
// (tests/test_webhook_go_parity.py). It is built against an unpacked Go HAMi tree by
// scripts/gen-go-vectors.sh; nothing of Go HAMi is copied into this repository.
//
//	webhook -specs specs.json -out vectors.json -commit <sha> -command "<how it was run>"
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	jsonpatch "github.com/evanphx/json-patch"
	jsonpatchops "gomodules.xyz/jsonpatch/v2"
	"gopkg.in/yaml.v2"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/Project-HAMi/HAMi/pkg/scheduler"
	"github.com/Project-HAMi/HAMi/pkg/scheduler/config"
)

// deviceConfig is the NVIDIA section of Go HAMi's chart (the one tests/_gohami.py runs
// Go's scheduler with): defaultGPUNum 1, no core policy, no runtime class.
const deviceConfig = `
nvidia:
  resourceCountName: nvidia.com/gpu
  resourceMemoryName: nvidia.com/gpumem
  resourceMemoryPercentageName: nvidia.com/gpumem-percentage
  resourceCoreName: nvidia.com/gpucores
  resourcePriorityName: nvidia.com/priority
  overwriteEnv: false
  defaultMemory: 0
  defaultCores: 0
  defaultGPUNum: 1
  memoryFactor: 1
  deviceSplitCount: 10
  deviceMemoryScaling: 1
  deviceCoreScaling: 1
`

type specFile struct {
	Cases []struct {
		Name string          `json:"name"`
		Pod  json.RawMessage `json:"pod"`
	} `json:"cases"`
}

type outcome struct {
	Allowed bool   `json:"allowed"`
	Code    int32  `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
	// The JSON patch Go answered with, and the pod after it (what the API server stores
	// before its own defaulting).
	Patch  []map[string]any `json:"patch"`
	Result map[string]any   `json:"result,omitempty"`
}

type vector struct {
	Name string         `json:"name"`
	Pod  map[string]any `json:"pod"` // the spec as Go decodes and encodes it
	Go   outcome        `json:"go"`
}

type vectorFile struct {
	About     string   `json:"about"`
	Commit    string   `json:"commit"`
	Command   string   `json:"command"`
	Config    string   `json:"device_config"`
	Scheduler string   `json:"scheduler_name"`
	ForceOver bool     `json:"force_overwrite_default_scheduler"`
	GoVersion string   `json:"go_version"`
	Vectors   []vector `json:"vectors"`
}

func main() {
	runGenerator("webhook vectors", "specs", "pod specs (JSON)", false, run)
}

func run(specsPath, outPath, commit, command, goVersion string) error {
	var cfg config.Config
	if err := yaml.Unmarshal([]byte(deviceConfig), &cfg); err != nil {
		return err
	}
	if err := config.InitDevicesWithConfig(&cfg); err != nil {
		return err
	}
	// cmd/scheduler's defaults with HAMi's chart: --scheduler-name set, force overwrite on.
	config.SchedulerName = "hami-scheduler"
	config.ForceOverwriteDefaultScheduler = true
	hook, err := scheduler.NewWebHook()
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(specsPath)
	if err != nil {
		return err
	}
	var specs specFile
	if err := json.Unmarshal(raw, &specs); err != nil {
		return err
	}
	file := vectorFile{
		About: "Go HAMi's own webhook (pkg/scheduler webhook + every device's MutateAdmission) " +
			"run on each pod of tools/gohami-vectors/webhook/specs.json; made by " +
			"scripts/gen-go-vectors.sh webhook, compared by tests/test_webhook_go_parity.py",
		Commit: commit, Command: command, Config: deviceConfig, GoVersion: goVersion,
		Scheduler: config.SchedulerName, ForceOver: config.ForceOverwriteDefaultScheduler,
	}
	for _, spec := range specs.Cases {
		v, err := one(hook, spec.Name, spec.Pod)
		if err != nil {
			return fmt.Errorf("case %s: %w", spec.Name, err)
		}
		file.Vectors = append(file.Vectors, v)
	}
	body, err := json.MarshalIndent(file, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(outPath, append(body, '\n'), 0o644)
}

// one sends a pod through the handler as the API server would (CREATE) and records the answer.
func one(hook *admission.Webhook, name string, spec json.RawMessage) (vector, error) {
	// The input is the pod as Go encodes it, so the patch holds only the webhook's changes
	// (not Go's encoding of empty fields).
	var pod corev1.Pod
	if err := json.Unmarshal(spec, &pod); err != nil {
		return vector{}, err
	}
	raw, err := json.Marshal(&pod)
	if err != nil {
		return vector{}, err
	}
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID:       types.UID("uid-" + name),
		Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
		Namespace: pod.Namespace,
		Name:      pod.Name,
		Operation: admissionv1.Create,
		Object:    runtime.RawExtension{Raw: raw},
	}}
	resp := hook.Handle(context.Background(), req)
	v := vector{Name: name, Go: outcome{Allowed: resp.Allowed, Patch: []map[string]any{}}}
	if err := json.Unmarshal(raw, &v.Pod); err != nil {
		return vector{}, err
	}
	if resp.Result != nil && !resp.Allowed {
		v.Go.Code = resp.Result.Code
		v.Go.Message = resp.Result.Message
	}
	if !resp.Allowed {
		return v, nil
	}
	ops := resp.Patches
	if ops == nil {
		ops = []jsonpatchops.JsonPatchOperation{} // an answer without a patch
	}
	opsJSON, err := json.Marshal(ops)
	if err != nil {
		return vector{}, err
	}
	if err := json.Unmarshal(opsJSON, &v.Go.Patch); err != nil {
		return vector{}, err
	}
	patch, err := jsonpatch.DecodePatch(opsJSON)
	if err != nil {
		return vector{}, err
	}
	patched, err := patch.Apply(raw)
	if err != nil {
		return vector{}, err
	}
	if err := json.Unmarshal(patched, &v.Go.Result); err != nil {
		return vector{}, err
	}
	return v, nil
}
