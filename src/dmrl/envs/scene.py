"""MJCF of the MultiPath tabletop: a 5-joint suction arm, coloured cups, a pad and a central obstacle.

Top view (metres; the robot sits at the origin facing +y, its left is -x):

    Grasp: cups in a column near the robot, obstacle ahead, pad behind it.
    Reach: obstacle near the robot, cups in a column behind it.

The obstacle is a tall block straddling x = 0 whose top is above the arm's workspace ceiling, so a tip
(or a carried cup) gets from start to goal only by passing it on the left or on the right, and both
routes have the same length because the column of cups and the pad lie on x ~ 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from dmrl.envs import arm

COLORS: dict[str, tuple[float, float, float]] = {
    "red": (0.85, 0.15, 0.12),
    "green": (0.15, 0.70, 0.20),
    "blue": (0.15, 0.30, 0.90),
}
CUP_RADIUS = 0.03
CUP_HALF_HEIGHT = 0.04
PAD_RADIUS = 0.065
PAD_HEIGHT = 0.004
OBSTACLE_HALF = (0.09, 0.04, 0.15)  # half extents (x, y, z); top at 0.30 > workspace z_max 0.25


@dataclass(frozen=True)
class Layout:
    """Nominal positions of one task; resets jitter around them (see MultiPathEnv._sample_layout)."""

    home: tuple[float, float, float]  # suction-tip start
    obstacle_y: float
    cup_ys: tuple[float, ...]  # column of cup slots (x ~ 0)
    pad: tuple[float, float]


LAYOUTS: dict[str, Layout] = {
    "grasp": Layout(home=(0.0, 0.22, 0.22), obstacle_y=0.50, cup_ys=(0.22, 0.31, 0.40), pad=(0.0, 0.66)),
    "reach": Layout(home=(0.0, 0.22, 0.20), obstacle_y=0.40, cup_ys=(0.56, 0.64, 0.72), pad=(0.0, 0.26)),
}

_CAMERAS = {
    # name: (pos, xyaxes); "front" sees every cup, the obstacle, the pad and the tool without occlusion.
    "front": ("0.8 0.25 0.9", "0.2426 0.9701 0 -0.6962 0.1741 0.6963"),  # high, from the right side
    "top": ("0 0.48 1.25", "1 0 0 0 1 0"),
    "side": ("1.0 0.48 0.55", "0 1 0 -0.45 0 0.89"),
}
CAMERA_NAMES = tuple(_CAMERAS)


def build_mjcf(task: str, colors: tuple[str, ...], cameras: tuple[str, ...], obstacle_y: float) -> str:
    """Return the MJCF string for ``task`` with one cup per colour and the named cameras."""
    layout = LAYOUTS[task]
    ox, oy, oz = OBSTACLE_HALF
    cups = "\n".join(_cup(i, c, layout.cup_ys[i]) for i, c in enumerate(colors))
    welds = "\n".join(
        f'    <weld name="suction_{i}" body1="tool" body2="cup_{i}" active="false" solref="0.01 1"/>'
        for i in range(len(colors))
    )
    cams = "\n".join(
        f'    <camera name="{n}" pos="{_CAMERAS[n][0]}" xyaxes="{_CAMERAS[n][1]}" fovy="45"/>' for n in cameras
    )
    lim = arm.JOINT_LIMITS
    return f"""<mujoco model="multipath_{task}">
  <compiler angle="radian" autolimits="true"/>
  <option timestep="0.01" integrator="implicitfast" cone="elliptic"/>
  <visual>
    <quality shadowsize="0" numslices="10" numstacks="4" numquads="1"/>
    <global offwidth="256" offheight="256"/>
    <headlight ambient="0.45 0.45 0.45" diffuse="0.5 0.5 0.5" specular="0 0 0"/>
  </visual>
  <default>
    <geom solref="0.005 1" friction="1 0.01 0.001"/>
    <default class="link">
      <geom type="capsule" contype="2" conaffinity="1" rgba="0.62 0.64 0.68 1" density="400"/>
      <joint damping="8" armature="0.05"/>
      <position kp="600" forcerange="-200 200"/>
    </default>
  </default>
  <asset>
    <texture name="grid" type="2d" builtin="checker" rgb1="0.80 0.78 0.74" rgb2="0.74 0.72 0.68"
             width="256" height="256"/>
    <material name="table" texture="grid" texrepeat="6 6"/>
  </asset>
  <worldbody>
    <light pos="0 0.4 1.6" dir="0 0 -1" diffuse="0.5 0.5 0.5" castshadow="false"/>
    <geom name="table" type="plane" size="0.8 0.9 0.3" pos="0 0.3 0" material="table"/>
    <geom name="pedestal" type="cylinder" size="0.06 0.13" pos="0 0 0.13" rgba="0.25 0.25 0.28 1"
          contype="0" conaffinity="0"/>
    <body name="obstacle" pos="0 {obstacle_y} {oz}">
      <geom name="obstacle" type="box" size="{ox} {oy} {oz}" rgba="0.45 0.30 0.20 1"/>
      <!-- touch sensor volume: any contact force on the obstacle reads > 0 (cheaper than scanning contacts) -->
      <site name="obstacle_zone" type="box" size="{ox + 0.005} {oy + 0.005} {oz + 0.005}" rgba="0 0 0 0"/>
    </body>
    <body name="pad" pos="{layout.pad[0]} {layout.pad[1]} 0" mocap="true">
      <geom name="pad" type="cylinder" size="{PAD_RADIUS} {PAD_HEIGHT / 2}" pos="0 0 {PAD_HEIGHT / 2}"
            rgba="0.95 0.85 0.20 1" contype="0" conaffinity="0"/>
    </body>
{cams}
    <body name="base" pos="0 0 {arm.SHOULDER_HEIGHT}" gravcomp="1" childclass="link">
      <joint name="base_yaw" axis="0 0 1" range="{lim[0, 0]} {lim[0, 1]}"/>
      <geom type="cylinder" size="0.05 0.03" contype="0" conaffinity="0"/>
      <body name="upper_arm" gravcomp="1">
        <joint name="shoulder" axis="1 0 0" range="{lim[1, 0]} {lim[1, 1]}"/>
        <geom fromto="0 0.04 0 0 {arm.UPPER_ARM - 0.04} 0" size="0.03" contype="0" conaffinity="0"/>
        <body name="forearm" pos="0 {arm.UPPER_ARM} 0" gravcomp="1">
          <joint name="elbow" axis="1 0 0" range="{lim[2, 0]} {lim[2, 1]}"/>
          <geom fromto="0 0.04 0 0 {arm.FOREARM - 0.04} 0" size="0.025"/>
          <body name="wrist" pos="0 {arm.FOREARM} 0" gravcomp="1">
            <joint name="wrist_pitch" axis="1 0 0" range="{lim[3, 0]} {lim[3, 1]}"/>
            <geom type="sphere" size="0.03"/>
            <body name="tool" gravcomp="1">
              <joint name="wrist_roll" axis="0 0 1" range="{lim[4, 0]} {lim[4, 1]}"/>
              <site name="wrist_ft" pos="0 0 -0.02"/>
              <geom name="tool_shaft" fromto="0 0 -0.02 0 0 {-(arm.TOOL - 0.025)}" size="0.012"/>
              <geom name="tool_fin" type="box" size="0.03 0.004 0.012" pos="0 0 -0.05" rgba="0.2 0.2 0.2 1"/>
              <geom name="suction_cup" type="cylinder" size="0.018 0.006" pos="0 0 {-(arm.TOOL - 0.006)}"
                    rgba="0.15 0.15 0.15 1"/>
              <site name="tip" pos="0 0 {-arm.TOOL}" size="0.005"/>
              <site name="suction_zone" type="cylinder" size="0.022 0.008" pos="0 0 {-arm.TOOL}"
                    rgba="0 0 0 0"/>
            </body>
          </body>
        </body>
      </body>
    </body>
{cups}
  </worldbody>
  <equality>
{welds}
  </equality>
  <actuator>
{_actuators()}
  </actuator>
  <sensor>
    <force name="wrist_force" site="wrist_ft"/>
    <touch name="suction_touch" site="suction_zone"/>
    <touch name="obstacle_touch" site="obstacle_zone"/>
  </sensor>
</mujoco>
"""


def _cup(i: int, color: str, y: float) -> str:
    r, g, b = COLORS[color]
    return f"""    <body name="cup_{i}" pos="0 {y} {CUP_HALF_HEIGHT}">
      <freejoint name="cup_{i}"/>
      <geom name="cup_{i}" type="cylinder" size="{CUP_RADIUS} {CUP_HALF_HEIGHT}" mass="0.12"
            rgba="{r} {g} {b} 1" condim="4"/>
      <geom type="cylinder" size="{CUP_RADIUS * 0.75} 0.002" pos="0 0 {CUP_HALF_HEIGHT}"
            rgba="{r * 0.6} {g * 0.6} {b * 0.6} 1" contype="0" conaffinity="0" mass="0"/>
    </body>"""


def _actuators() -> str:
    return "\n".join(
        f'    <position name="{j}" joint="{j}" class="link" ctrlrange="{lo} {hi}"/>'
        for j, (lo, hi) in zip(arm.JOINT_NAMES, arm.JOINT_LIMITS, strict=True)
    )
